"""The status page as HTML, rendered on the server from the ``/status`` document.

The page is whole without JavaScript (plain tables, a refresh every few seconds); with it,
``page/app.js`` fetches ``main_html`` again and swaps it in, so nothing is rendered twice.
Every value is escaped; the page has no forms and no state-changing links.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from html import escape

from traind.status.model import StatusSnapshot
from traind.status.render import duration
from traind.status.timeline import HistoryInfo
from traind.util.units import format_size

REFRESH = 5  # seconds between reloads of the page when JavaScript is off
ROWS = 12  # newest checkpoints listed in the timeline and in the store; older ones counted
BARS = 90  # at most this many bars in the upload chart

_GOOD = {"RUNNING", "committed", "running"}
_BAD = {"FATAL", "BACKOFF", "EXITED", "dropped", "stopping"}


def page_html(status: StatusSnapshot, now: float | None = None) -> str:
    """The whole document: the head (assets, no-JS refresh) around ``main_html``."""
    run = escape(status["run"])
    return (
        "<!doctype html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n"
        '<meta name=viewport content="width=device-width, initial-scale=1">\n'
        f"<title>traind · {run}</title>\n"
        '<link rel=stylesheet href="/page/style.css">\n'
        '<link rel=icon href="/page/icon.svg" type="image/svg+xml">\n'
        f'<noscript><meta http-equiv=refresh content="{REFRESH}"></noscript>\n'
        '<script src="/page/app.js" defer></script>\n'
        "</head>\n<body>\n<main id=main>\n"
        f"{main_html(status, now)}"
        "</main>\n</body>\n</html>\n"
    )


def main_html(status: StatusSnapshot, now: float | None = None) -> str:
    """The page's content, also served alone (``/?part=main``) for the live update."""
    now = time.time() if now is None else now
    return "".join([
        _header(status, now),
        _children(status),
        _upload(status),
        _charts(status.get("history"), now),
        _timeline(status, now),
        _store(status, now),
        _retention(status, now),
        _errors(status),
    ])


def _header(status: StatusSnapshot, now: float) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    return (
        f"<header><h1>traind <span class=run>{escape(status['run'])}</span></h1>"
        f"<p>{_badge(status['state'])} backend <code>{escape(status['backend'])}</code> · "
        f"pid {status['pid']} · up {duration(status['uptime'])} · "
        f"<span id=updated>as of {stamp}</span></p></header>\n"
    )


def _children(status: StatusSnapshot) -> str:
    children = status["children"]
    if not children:
        return _section("Children", "<p>none: traind watches output_dir only</p>")
    rows = [
        (escape(c["name"]), _badge(c["state"]), _opt(c["pid"]), duration(c["uptime"]),
         str(c["restarts"]), _opt(c["last_exit"]))
        for c in children
    ]
    return _section("Children", _table(
        ("child", "state", "pid", "uptime", "restarts", "last exit"), rows, "children"))


def _upload(status: StatusSnapshot) -> str:
    watcher, upload = status["watcher"], status["upload"]
    queue = (f"<p>{watcher['queued']} waiting for upload, {watcher['tracked']} being "
             "written</p>")
    if upload is None:
        return _section("Upload", f"<p id=upload>idle</p>{queue}")
    total = max(upload["bytes_total"], 1)
    share = min(1.0, upload["bytes_done"] / total)
    eta = "ETA ?" if upload["eta"] is None else f"ETA {duration(upload['eta'])}"
    body = (
        f"<p id=upload><b>{escape(upload['tag'])}</b> "
        f'<progress max="{total}" value="{upload["bytes_done"]}">{share:.0%}</progress> '
        f"{share:.0%} · {format_size(upload['bytes_done'])} of "
        f"{format_size(upload['bytes_total'])} · {_rate(upload['rate'])} · {eta}</p>{queue}"
    )
    return _section("Upload", body)


def _charts(history: HistoryInfo | None, now: float) -> str:
    if history is None:
        return ""
    bucket = history["bucket"]
    rate = [(t, b / bucket) for t, b in _merged(history["upload"], bucket)]
    return _section("Last hours", "<div class=charts>" + "".join([
        _chart("upload rate", rate, now, _rate, bars=True),
        _chart("time to safe", history["safe"], now, duration, bars=False),
    ]) + "</div>")


def _merged(points: Sequence[tuple[float, int]], bucket: float) -> list[tuple[float, int]]:
    """Upload buckets merged so that at most ``BARS`` bars are drawn (bytes averaged over
    each merged bucket's span, so the rate stays a rate)."""
    if not points:
        return []
    span = points[-1][0] - points[0][0] + bucket
    k = max(1, math.ceil(span / bucket / BARS))
    merged: dict[float, int] = {}
    for t, b in points:
        start = t - (t - points[0][0]) % (k * bucket)
        merged[start] = merged.get(start, 0) + b
    return [(t, b // k) for t, b in merged.items()]


def _chart(title: str, points: Sequence[tuple[float, float]], now: float,
           fmt: Callable[[float], str], bars: bool) -> str:
    """A small SVG from the first point to now: bars (upload rate) or dots (one per
    commit), scaled to the largest value."""
    head = f"<figure><figcaption>{escape(title)}"
    if not points:
        return head + " <span class=muted>no data yet</span></figcaption></figure>"
    w, h = 300.0, 80.0
    t0 = min(t for t, _ in points)
    t1 = max(now, max(t for t, _ in points), t0 + 60)
    top = max(v for _, v in points) or 1.0
    marks = []
    width = max(2.0, (w - 8) / BARS - 1)
    for t, v in points:
        x = 4 + (t - t0) / (t1 - t0) * (w - 8)
        y = h - 2 - v / top * (h - 8)
        if bars:
            marks.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" '
                         f'height="{h - 2 - y:.1f}"/>')
        else:
            marks.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5"/>')
    return (
        f"{head} <span class=muted>max {escape(fmt(top))}, last {duration(t1 - t0)}</span>"
        f"</figcaption><svg viewBox=\"0 0 {w:.0f} {h:.0f}\" role=img "
        f'aria-label="{escape(title)}"><line x1="0" y1="{h - 1}" x2="{w}" y2="{h - 1}"/>'
        f"{''.join(marks)}</svg></figure>"
    )


def _timeline(status: StatusSnapshot, now: float) -> str:
    entries = status.get("timeline", [])
    if not entries:
        return _section("Checkpoints", "<p>none saved since this daemon started</p>")
    uploading = status["upload"]["tag"] if status["upload"] else None
    rows = []
    for e in list(reversed(entries))[:ROWS]:
        stage = "uploading" if e["tag"] == uploading and e["stage"] == "queued" else e["stage"]
        if e["safe_seconds"] is not None:
            safe = duration(e["safe_seconds"])
        elif e["stage"] == "dropped":
            safe = "never (dropped)"
        else:
            safe = f"not yet ({duration(now - e['written_at'])})"
        rows.append((
            escape(e["tag"]), str(e["step"]), format_size(e["bytes"]),
            f"{duration(now - e['written_at'])} ago",
            f"+{duration(e['staged_at'] - e['written_at'])}", _badge(stage), safe,
        ))
    return _section("Checkpoints", _table(
        ("checkpoint", "step", "size", "written", "snapshot", "stage", "safe after"),
        rows, "timeline") + _more(len(entries)))


def _store(status: StatusSnapshot, now: float) -> str:
    notes = []
    if dropped := status.get("dropped", []):
        notes.append(f"<p class=bad>{len(dropped)} dropped unstored (disk full while the store "
                     f"was behind): {escape(', '.join(d['tag'] for d in dropped))}</p>")
    for held in status.get("held", []):
        notes.append(f"<p>{escape(held['tag'])} waits on writer {escape(held['holder'])}'s "
                     f"claim (stale in {duration(max(0.0, held['stale_at'] - now))})</p>")
    for part in status.get("parts", []):
        notes.append(f"<p>{escape(part['tag'])}: nodes {_ints(part['missing'])} missing "
                     f"(in: {_ints(part['present'])})</p>")
    committed = status["committed"]
    if committed:
        rows = [(escape(c["tag"]), str(c["step"]), format_size(c["bytes"]),
                 f"{duration(now - c['committed_at'])} ago")
                for c in list(reversed(committed))[:ROWS]]
        table = _table(("committed", "step", "size", "age"), rows, "committed")
        table += _more(len(committed))
    else:
        table = "<p>nothing committed yet</p>"
    return _section("In the store", table + "".join(notes))


def _retention(status: StatusSnapshot, now: float) -> str:
    at = status["next_prune"]
    when = "-" if at is None else (f"in {duration(at - now)}" if at > now else "due now")
    prune = status.get("prune", [])
    if prune:
        items = "".join(f"<li><b>{escape(p['tag'])}</b> {escape(p['reason'])}</li>"
                        for p in prune)
        what = f"<p>it will remove:</p><ul id=prune>{items}</ul>"
    else:
        what = "<p id=prune>it will remove nothing</p>"
    return _section("Retention", f"<p>next prune {when}</p>{what}")


def _errors(status: StatusSnapshot) -> str:
    errors = status["errors"]
    if not errors:
        return _section("Recent errors", "<p id=errors>none</p>")
    items = []
    for e in reversed(errors):
        stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        hint = f"<p class=hint>{escape(h)}</p>" if (h := e.get("hint")) else ""
        items.append(f"<li><time>{stamp}</time> <b>{escape(e['event'])}</b> "
                     f"<code>{escape(e['message'])}</code>{hint}</li>")
    return _section("Recent errors", f"<ul id=errors>{''.join(items)}</ul>")


def _section(title: str, body: str) -> str:
    ident = title.lower().replace(" ", "-")
    return f'<section aria-labelledby="h-{ident}"><h2 id="h-{ident}">{title}</h2>{body}</section>\n'


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], ident: str) -> str:
    """A table of already-escaped cells, scrolling sideways on a narrow screen."""
    head = "".join(f"<th scope=col>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<div class=scroll><table id={ident}><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def _more(count: int) -> str:
    return f"<p class=muted>and {count - ROWS} older</p>" if count > ROWS else ""


def _badge(state: str) -> str:
    kind = "good" if state in _GOOD else "bad" if state in _BAD else "busy"
    return f"<span class=\"badge {kind}\">{escape(state)}</span>"


def _rate(bytes_per_second: float) -> str:
    return f"{format_size(bytes_per_second)}/s"


def _ints(values: Iterable[int]) -> str:
    return ", ".join(map(str, values)) or "-"


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)

"""``traind status`` as text: a header, the children, the queue, the upload bar, the
committed checkpoints, the next prune and recent errors."""

from __future__ import annotations

import time
from collections.abc import Sequence

from traind.status.model import StatusSnapshot, UploadInfo
from traind.util.progress import Progress
from traind.util.units import format_size


class _Reported(Progress):
    """A Progress whose rate and ETA come from the daemon, so the bar is drawn by the one
    implementation in ``Progress.line``."""

    def __init__(self, upload: UploadInfo) -> None:
        super().__init__(upload["bytes_total"])
        self.done = upload["bytes_done"]
        self._rate = upload["rate"]
        self._eta = upload["eta"]

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def eta(self) -> float | None:
        return self._eta


def render(status: StatusSnapshot, now: float | None = None) -> str:
    """The readable status page (``now`` is the Unix time ages are measured from)."""
    now = time.time() if now is None else now
    out = [
        f"traind  run {status['run']}  state {status['state']}  backend {status['backend']}  "
        f"pid {status['pid']}  up {duration(status['uptime'])}",
        "",
    ]
    children = status["children"]
    if children:
        out += table(
            ("CHILD", "STATE", "PID", "UPTIME", "RESTARTS", "LAST EXIT"),
            [(c["name"], c["state"], _opt(c["pid"]), duration(c["uptime"]), str(c["restarts"]),
              _opt(c["last_exit"])) for c in children],
        )
    else:
        out.append("children   none (watching output_dir only)")
    watcher, upload = status["watcher"], status["upload"]
    out += [
        "",
        f"queue      {watcher['queued']} waiting for upload, {watcher['tracked']} being written",
        f"upload     {upload['tag']}  {_Reported(upload).line()}" if upload else "upload     idle",
        "",
    ]
    committed = status["committed"]
    if committed:
        out += table(
            ("COMMITTED", "STEP", "SIZE", "AGE"),
            [(c["tag"], str(c["step"]), format_size(c["bytes"]),
              duration(now - c["committed_at"]) + " ago") for c in committed],
        )
    else:
        out.append("committed  none yet")
    out += _waiting(status, now)
    out.append(f"next prune {_when(status['next_prune'], now)}")
    if status["errors"]:
        out += ["", "recent errors (oldest first)"]
        for e in status["errors"]:
            out.append(f"  {time.strftime('%H:%M:%S', time.localtime(e['time']))}  "
                       f"{e['event']}  {e['message']}")
            if hint := e.get("hint"):
                out.append(f"            hint: {hint}")
    return "\n".join(out) + "\n"


def _waiting(status: StatusSnapshot, now: float) -> list[str]:
    """Lines for what is held back: snapshots dropped unstored, tags waiting on another
    writer's claim, parts waiting on other nodes, a start waiting on the resume agreement."""
    lines: list[str] = []
    dropped = status.get("dropped", [])
    if dropped:
        lines.append(f"dropped    {len(dropped)} not stored (disk full while the store was "
                     f"behind): {', '.join(d['tag'] for d in dropped)}")
    for held in status.get("held", []):
        stale = (f"in {duration(held['stale_at'] - now)}" if held["stale_at"] > now
                 else "now")
        lines.append(f"waiting    {held['tag']} on writer {held['holder']}'s claim (its upload "
                     f"is not committed; stale {stale} unless renewed)")
    for part in status.get("parts", []):
        lines.append(f"parts      {part['tag']}: this node ({part['node_rank']}) stored; nodes "
                     f"{', '.join(map(str, part['present']))} in, "
                     f"{', '.join(map(str, part['missing']))} missing (not committed yet)")
    if (resume := status.get("resume")) is not None:
        missing = resume["missing"]
        which = ("node 0 has not counted this node's request yet" if missing is None
                 else f"nodes {', '.join(map(str, missing))} missing")
        waited = duration(now - resume["since"])
        lines.append(f"resume     node {resume['node_rank']} waits {waited} for the resume "
                     f"point every node starts from ({which})")
    return lines


def one_line(status: StatusSnapshot) -> str:
    """A summary for systemd's ``STATUS=``: children, the upload, the newest commit."""
    parts = [f"{c['name']} {c['state'].lower()}" for c in status["children"]]
    upload = status["upload"]
    if upload is not None:
        done = upload["bytes_done"] / upload["bytes_total"] if upload["bytes_total"] else 1.0
        parts.append(f"uploading {upload['tag']} {done:.0%}")
    elif status["watcher"]["queued"]:
        parts.append(f"{status['watcher']['queued']} queued")
    committed = status["committed"]
    parts.append(f"last commit {committed[-1]['tag']}" if committed else "nothing committed yet")
    return f"{status['state']}: " + ", ".join(parts)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart."""
    lines = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines]


def duration(seconds: float) -> str:
    """``3h12m``, ``4m05s``, ``7s``."""
    s = max(0, round(seconds))
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    return f"in {duration(at - now)}" if at > now else "due now"


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)

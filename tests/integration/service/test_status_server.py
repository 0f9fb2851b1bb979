"""The status server and ``traind status``: real sockets, real HTTP, parsed metrics."""

from __future__ import annotations

import asyncio
import io
import json
import platform
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.net import free_port
from tests.support.requires import need_binary

from traind import __version__
from traind.errors import TraindError
from traind.status import model
from traind.status.client import NOT_RUNNING, status_command
from traind.status.metrics import Metrics
from traind.status.render import duration, one_line, render
from traind.status.server import StatusServer
from traind.status.timeline import HistoryInfo, TimelineEntry
from traind.supervisor.process import State
from traind.util.address import TCPAddress, UnixAddress, parse_listen

GiB = 1024**3
NOW = 1_700_000_000.0


def sample() -> model.StatusSnapshot:
    """A daemon mid-run: two children, an upload at 48%, two committed checkpoints."""
    return model.snapshot(
        run="grpo-qwen",
        state="running",
        started=NOW - 3600,
        backend="local:/mnt/ckpt",
        children=[
            model.ChildInfo(
                name="vllm", state="RUNNING", pid=4100, uptime=3590.0, restarts=0, last_exit=None
            ),
            model.ChildInfo(
                name="trainer", state="BACKOFF", pid=None, uptime=0.0, restarts=2, last_exit=-9
            ),
        ],
        queued=1,
        tracked=2,
        upload=model.UploadInfo(
            tag="checkpoint-400",
            bytes_done=int(1.2 * GiB),
            bytes_total=int(2.5 * GiB),
            rate=180e6,
            eta=7.4,
        ),
        committed=[
            model.committed_info("checkpoint-300", 300, int(2.5 * GiB), NOW - 600),
            model.committed_info("checkpoint-200", 200, int(2.5 * GiB), NOW - 1200),
        ],
        next_prune=NOW + 240,
        prune=[model.PruneInfo(tag="checkpoint-100", step=100, reason="older than the last 2")],
        errors=[
            model.ErrorInfo(
                time=NOW - 30,
                event="checkpoint_upload_failed",
                message="tag=checkpoint-400 error=timeout",
                hint="retried with backoff",
            )
        ],
        timeline=[
            TimelineEntry(tag="checkpoint-300", step=300, bytes=int(2.5 * GiB),
                          stage="committed", written_at=NOW - 700, staged_at=NOW - 699,
                          done_at=NOW - 600, safe_seconds=100.0),
            TimelineEntry(tag="checkpoint-400", step=400, bytes=int(2.5 * GiB),
                          stage="queued", written_at=NOW - 60, staged_at=NOW - 59,
                          done_at=None, safe_seconds=None),
        ],
        history=json.loads(json.dumps(HistoryInfo(  # as JSON has it: pairs are lists
            bucket=60.0, upload=[(NOW - 120, 6_000_000_000), (NOW - 60, 3_000_000_000)],
            safe=[(NOW - 600, 100.0)]))),
        now=NOW,
    )


def recorded() -> Metrics:
    """Metrics after two commits, some bytes, one restart, a queue of 3, a RUNNING trainer
    and a vLLM in BACKOFF."""
    clock = [NOW]
    metrics = Metrics(clock=lambda: clock[0], child_states=list(State))
    metrics.uploaded(1000)
    metrics.uploaded(500)
    metrics.committed(200, 1500, 4.0)
    metrics.committed(300, 2500, 40.0)
    metrics.restarted("trainer")
    metrics.add_child("vllm")
    metrics.child_in("trainer", "RUNNING", up=True)
    metrics.child_in("vllm", "BACKOFF", up=False)
    metrics.set_queue_depth(lambda: 3)
    clock[0] = NOW + 90
    return metrics


async def get(url: str, unix: Path | None = None) -> tuple[int, str, str]:
    """GET ``url`` within 5 s: (status, content type header, body)."""
    connector = aiohttp.UnixConnector(path=str(unix)) if unix else aiohttp.TCPConnector()
    async with (
        asyncio.timeout(5),
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url) as response,
    ):
        return response.status, response.headers["Content-Type"], await response.text()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page by (name, labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
async def server() -> AsyncIterator[StatusServer]:
    """A status server on a free loopback port serving ``sample()`` and ``recorded()``."""
    async with asyncio.timeout(5), StatusServer("127.0.0.1:0", sample, recorded()) as s:
        yield s


async def test_healthz_and_status(server: StatusServer) -> None:
    """/healthz answers ok; /status is the daemon's snapshot as JSON."""
    base = f"http://{server.address}"
    assert (await get(f"{base}/healthz"))[::2] == (200, "ok")
    status, ctype, body = await get(f"{base}/status")
    assert (status, ctype.split(";")[0]) == (200, "application/json")
    assert json.loads(body) == sample()


async def test_metrics_show_what_was_recorded(server: StatusServer) -> None:
    """/metrics is Prometheus text whose numbers are the ones the daemon reported."""
    status, ctype, body = await get(f"http://{server.address}/metrics")
    assert status == 200
    assert ctype.startswith("text/plain; version=0.0.4")
    got = samples(body)
    assert got[("traind_uploaded_bytes_total", ())] == 1500
    assert got[("traind_committed_bytes_total", ())] == 4000
    assert got[("traind_checkpoints_committed_total", ())] == 2
    assert got[("traind_child_restarts_total", (("child", "trainer"),))] == 1
    assert got[("traind_child_restarts_total", (("child", "vllm"),))] == 0
    assert got[("traind_commit_seconds_count", ())] == 2
    assert got[("traind_commit_seconds_sum", ())] == 44.0
    assert got[("traind_commit_seconds_bucket", (("le", "5.0"),))] == 1
    assert got[("traind_queue_depth", ())] == 3
    assert got[("traind_last_committed_step", ())] == 300
    assert got[("traind_last_commit_timestamp_seconds", ())] == NOW
    assert got[("traind_seconds_since_last_commit", ())] == 90


async def test_metrics_name_the_build_and_each_child_state(server: StatusServer) -> None:
    """/metrics has traind_build_info{version,python}, traind_child_up and a one-hot
    traind_child_state per child, and no *_created series."""
    _, _, body = await get(f"http://{server.address}/metrics")
    got = samples(body)
    build = (("python", platform.python_version()), ("version", __version__))
    assert got[("traind_build_info", build)] == 1
    assert got[("traind_child_up", (("child", "trainer"),))] == 1
    assert got[("traind_child_up", (("child", "vllm"),))] == 0
    states = {labels: v for (name, labels), v in got.items() if name == "traind_child_state"}
    assert len(states) == 2 * len(State)
    assert {dict(k)["child"]: dict(k)["state"] for k, v in states.items() if v == 1} == {
        "trainer": "RUNNING", "vllm": "BACKOFF",
    }
    assert not [name for name, _ in got if name.endswith("_created")]
    assert "_created" not in body


async def test_promtool_finds_nothing_to_complain_about(server: StatusServer) -> None:
    """``promtool check metrics`` accepts the page as served (names, units, help, types)."""
    promtool = need_binary("promtool")
    _, _, body = await get(f"http://{server.address}/metrics")
    done = await asyncio.to_thread(
        subprocess.run, [promtool, "check", "metrics"], input=body, capture_output=True,
        text=True, timeout=30, check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_no_commit_yet_means_no_age() -> None:
    """Before the first commit the age gauge has no sample rather than a made-up one."""
    got = samples(Metrics().render().decode())
    assert ("traind_seconds_since_last_commit", ()) not in got
    assert got[("traind_checkpoints_committed_total", ())] == 0


def test_metrics_registries_are_private() -> None:
    """Two daemons in one process (tests) do not share or collide on metrics."""
    a, b = Metrics(), Metrics()
    a.uploaded(7)
    assert samples(b.render().decode())[("traind_uploaded_bytes_total", ())] == 0


async def test_unix_socket(tmp_path: Path) -> None:
    """listen = unix:/path serves the same pages; stopping removes the socket file."""
    path = tmp_path / "run" / "status.sock"
    async with asyncio.timeout(5), StatusServer(f"unix:{path}", sample, recorded()):
        assert (await get("http://traind/healthz", unix=path))[::2] == (200, "ok")
        status, _, body = await get("http://traind/status", unix=path)
        assert (status, json.loads(body)["run"]) == (200, "grpo-qwen")
    assert not path.exists()


async def test_stop_frees_the_port() -> None:
    """After stop nothing answers, and a new server can bind the same port at once."""
    port = free_port()
    async with asyncio.timeout(5):
        async with StatusServer(f"127.0.0.1:{port}", sample, recorded()):
            await get(f"http://127.0.0.1:{port}/status")
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(f"http://127.0.0.1:{port}/healthz")
        async with StatusServer(f"127.0.0.1:{port}", sample, recorded()):
            assert (await get(f"http://127.0.0.1:{port}/healthz"))[0] == 200


async def test_port_in_use_is_a_clear_error() -> None:
    """A taken port raises TraindError naming the key and the address."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(TraindError, match=f"status.listen 127.0.0.1:{port} is already in use"):
            async with asyncio.timeout(5), StatusServer(f"127.0.0.1:{port}", sample, Metrics()):
                pass


async def test_broken_snapshot_is_a_500_not_a_dead_server() -> None:
    """A snapshot that raises gives 500 with the error; the server keeps serving."""

    def broken() -> dict[str, Any]:
        raise KeyError("children")

    async with asyncio.timeout(5), StatusServer("127.0.0.1:0", broken, Metrics()) as s:
        status, _, body = await get(f"http://{s.address}/status")
        assert status == 500
        assert "children" in json.loads(body)["error"]
        assert (await get(f"http://{s.address}/healthz"))[0] == 200


async def test_status_command_renders_the_table(
    server: StatusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """``traind status`` prints header, children, queue, the upload bar and checkpoints."""
    out = io.StringIO()
    async with asyncio.timeout(10):
        shown = await asyncio.to_thread(status_command, str(server.address), False, None, out)
    assert shown == 0
    text = out.getvalue()
    assert "run grpo-qwen  state running  backend local:/mnt/ckpt" in text
    assert "up 1h00m" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["CHILD", "STATE", "PID", "UPTIME", "RESTARTS", "LAST", "EXIT"] in rows
    assert ["trainer", "BACKOFF", "-", "0s", "2", "-9"] in rows
    assert "1 waiting for upload, 2 being written" in text
    assert "checkpoint-400  [##############................]  48%  1.2 GiB/2.5 GiB" in text
    assert "180 MB/s  ETA 7s" in text
    assert "checkpoint-300  300" in text
    assert "checkpoint_upload_failed  tag=checkpoint-400 error=timeout" in text
    assert "hint: retried with backoff" in text


async def test_status_command_json(server: StatusServer) -> None:
    """``--json`` prints the daemon's document unchanged."""
    out = io.StringIO()
    async with asyncio.timeout(10):
        shown = await asyncio.to_thread(status_command, str(server.address), True, None, out)
    assert shown == 0
    assert json.loads(out.getvalue()) == sample()


class _Interrupted(Exception):
    """What Ctrl-C is to ``--watch``, raised by the terminal after a few frames."""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def flush(self) -> None:
        if self.getvalue().count("\x1b[H\x1b[2J") >= 3:
            raise _Interrupted


async def test_status_command_watch_redraws(server: StatusServer) -> None:
    """``--watch`` clears the terminal and redraws until interrupted."""
    out = _Terminal()
    with pytest.raises(_Interrupted):
        async with asyncio.timeout(5):
            await asyncio.to_thread(status_command, str(server.address), False, 0.05, out)
    frames = out.getvalue().split("\x1b[H\x1b[2J")
    assert len(frames) >= 3
    assert all("run grpo-qwen" in f for f in frames[1:])


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_daemon_not_running(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no daemon the command exits 3 and says how to check the service."""
    listen = f"127.0.0.1:{free_port()}" if kind == "tcp" else f"unix:{tmp_path}/none.sock"
    async with asyncio.timeout(10):
        assert await asyncio.to_thread(status_command, listen, False, None) == NOT_RUNNING
    err = capsys.readouterr().err
    assert f"no traind answering at {listen} — is the service running?" in err
    assert "`systemctl status traind`" in err


def test_render_idle_daemon() -> None:
    """A daemon with no children, no upload and nothing committed still reads well."""
    text = render(
        model.snapshot(run="r", state="starting", started=NOW, backend="memory", now=NOW), now=NOW
    )
    assert "children   none" in text
    assert "upload     idle" in text
    assert "committed  none yet" in text
    assert "next prune -" in text
    assert "recent errors" not in text


def test_one_line_summary() -> None:
    """The STATUS= line names the children, the upload and the newest commit."""
    assert one_line(sample()) == (
        "running: vllm running, trainer backoff, uploading checkpoint-400 48%, "
        "last commit checkpoint-300"
    )


@pytest.mark.parametrize(
    ("listen", "parsed"),
    [
        ("127.0.0.1:9750", TCPAddress("127.0.0.1", 9750)),
        ("[::1]:9750", TCPAddress("::1", 9750)),
        ("unix:/run/traind/status.sock", UnixAddress(Path("/run/traind/status.sock"))),
    ],
)
def test_parse_listen(listen: str, parsed: TCPAddress | UnixAddress) -> None:
    """host:port, [v6]:port and unix:/abs/path are understood and print back the same."""
    assert parse_listen(listen) == parsed
    assert str(parsed) == listen


@pytest.mark.parametrize("listen", ["9750", "localhost", "127.0.0.1:http", "unix:rel.sock"])
def test_parse_listen_rejects(listen: str) -> None:
    """Anything else is a ValueError that shows the accepted forms."""
    with pytest.raises(ValueError, match=r"host:port|absolute path"):
        parse_listen(listen)


def test_durations() -> None:
    """Durations are compact and exact to the second."""
    assert [duration(s) for s in (7, 245, 3600 + 12 * 60, 2 * 86400 + 3600)] == [
        "7s",
        "4m05s",
        "1h12m",
        "2d1h",
    ]


def test_recent_errors_from_log_events() -> None:
    """The structlog processor keeps error events with their fields, newest last, bounded."""
    recent = model.RecentErrors(size=2)
    for i in range(3):
        recent.processor(
            None, "error", {"event": "prune_failed", "error": f"e{i}", "timestamp": "t"}
        )
    recent.processor(None, "info", {"event": "checkpoint_committed"})
    assert [(e["event"], e["message"]) for e in recent.items()] == [
        ("prune_failed", "error=e1"),
        ("prune_failed", "error=e2"),
    ]


def test_recent_errors_keep_the_hint_apart() -> None:
    """An error's hint is its own field, not part of the message."""
    recent = model.RecentErrors()
    recent.processor(None, "error", {"event": "store_unreachable", "error": "refused",
                                     "hint": "check the endpoint"})
    assert recent.items()[0]["message"] == "error=refused"
    assert recent.items()[0]["hint"] == "check the endpoint"


@dataclass(frozen=True)
class _Child:
    """The fields of supervisor.runner.ChildStatus that child_info reads."""

    name: str
    state: str
    pid: int | None
    restarts: int
    returncode: int | None
    since: float


def test_child_info_from_runner_status() -> None:
    """A running child's uptime counts from its last state change; a stopped one has none."""
    running = _Child("vllm", "RUNNING", 42, 0, None, NOW - 50)
    exited = _Child("trainer", "EXITED", None, 2, 1, NOW - 50)
    assert model.child_info(running, now=NOW) == model.ChildInfo(
        name="vllm", state="RUNNING", pid=42, uptime=50.0, restarts=0, last_exit=None
    )
    assert model.child_info(exited, now=NOW)["uptime"] == 0.0
    assert model.child_info(exited, now=NOW)["last_exit"] == 1


async def test_status_page(server: StatusServer) -> None:
    """/ is the status page: children, upload progress, the checkpoint timeline, the chart,
    what the next prune removes and the errors with their hints, under a strict CSP."""
    async with (
        asyncio.timeout(5),
        aiohttp.ClientSession() as session,
        session.get(f"http://{server.address}/") as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/html"
        csp = response.headers["Content-Security-Policy"]
        html = await response.text()
    assert "script-src 'self'" in csp
    assert "form-action 'none'" in csp
    assert html.startswith("<!doctype html>")
    assert '<script src="/page/app.js" defer></script>' in html
    assert "<noscript><meta http-equiv=refresh" in html
    assert "<td>trainer</td><td><span class=\"badge bad\">BACKOFF</span></td>" in html
    assert '<progress max="2684354560" value="1288490188">48%</progress>' in html
    assert "<td>checkpoint-300</td><td>300</td>" in html
    assert "<td>1m40s</td>" in html  # checkpoint-300's time from written to safe
    assert "<td>not yet (" in html  # checkpoint-400 is not safe yet
    assert all(mark in html for mark in ("<svg", "<rect", "<circle"))
    assert "<b>checkpoint-100</b> older than the last 2" in html
    assert "<p class=hint>retried with backoff</p>" in html
    assert "<form" not in html


async def test_status_page_fragment_and_assets(server: StatusServer) -> None:
    """?part=main is the page's content alone; the page's files are served with an ETag
    (304 when unchanged), anything else under /page/ is 404, and / takes no POST."""
    base = f"http://{server.address}"
    async with asyncio.timeout(5), aiohttp.ClientSession() as session:
        async with session.get(f"{base}/?part=main") as response:
            part = await response.text()
        assert part.startswith("<header>")
        assert "<html" not in part
        for name, ctype in [("app.js", "text/javascript"), ("style.css", "text/css"),
                            ("icon.svg", "image/svg+xml")]:
            async with session.get(f"{base}/page/{name}") as response:
                assert (response.status, response.content_type) == (200, ctype)
                etag = response.headers["ETag"]
            async with session.get(f"{base}/page/{name}",
                                   headers={"If-None-Match": etag}) as response:
                assert response.status == 304
        async with session.get(f"{base}/page/../server.py") as response:
            assert response.status == 404
        async with session.post(f"{base}/") as response:
            assert response.status == 405


async def test_status_page_escapes_what_it_shows() -> None:
    """Names and messages from the run are shown as text, never as markup."""
    def hostile() -> model.StatusSnapshot:
        return model.snapshot(
            run="<script>alert(1)</script>", state="running", started=NOW, backend="memory",
            errors=[model.ErrorInfo(time=NOW, event="x", message="<img src=x onerror=1>")],
        )

    async with (
        asyncio.timeout(5),
        StatusServer("127.0.0.1:0", hostile, Metrics()) as s,
        aiohttp.ClientSession() as session,
        session.get(f"http://{s.address}/") as response,
    ):
        html = await response.text()
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


async def test_broken_snapshot_is_a_500_page() -> None:
    """A snapshot that raises gives the page as a 500 with the error."""

    def broken() -> dict[str, Any]:
        raise KeyError("children")

    async with asyncio.timeout(5), StatusServer("127.0.0.1:0", broken, Metrics()) as s:
        status, _, body = await get(f"http://{s.address}/")
    assert status == 500
    assert "children" in body

"""A stand-in for the vLLM server (stdlib only), plus the helpers tests use around it.

Run as ``python tests/support/fake_vllm.py --port P [flags]``: it refuses connections while
"loading", then serves ``/health`` and ``/health/`` (200) and ``POST /close_communicator/``.
Flags make it crash, exit 0, turn unhealthy (503), stop answering, ignore SIGTERM, or fork a
grandchild that leaves the process group. Times count from the moment it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SCRIPT = Path(__file__).resolve()

GRANDCHILD = """
import os, sys, time
os.setsid()
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\\n")
print("grandchild escaped", flush=True)
time.sleep(3600)
"""


class _State:
    ready_at = 0.0
    unhealthy_after: float | None = None
    hang_after: float | None = None
    close_log: str | None = None

    @classmethod
    def past(cls, after: float | None) -> bool:
        return after is not None and time.monotonic() - cls.ready_at >= after


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if _State.past(_State.hang_after):
            time.sleep(3600)
        if self.path not in ("/health", "/health/"):
            self._reply(404)
        else:
            self._reply(503 if _State.past(_State.unhealthy_after) else 200)

    def do_POST(self) -> None:
        if self.path != "/close_communicator/":
            self._reply(404)
            return
        if _State.close_log:
            with open(_State.close_log, "a") as f:
                f.write(f"{os.getpid()}\n")
        self._reply(200)

    def _reply(self, status: int) -> None:
        body = b'{"status": "ok"}' if status == 200 else b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _after(seconds: float | None, code: int) -> None:
    if seconds is not None:
        threading.Timer(seconds, os._exit, [code]).start()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--load-seconds", type=float, default=0.0)
    p.add_argument("--crash-after", type=float)
    p.add_argument("--exit0-after", type=float)
    p.add_argument("--unhealthy-after", type=float)
    p.add_argument("--hang-after", type=float)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--fork-grandchild", metavar="PIDFILE")
    p.add_argument("--close-log", metavar="FILE")
    a = p.parse_args(argv)
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"loading model for {a.load_seconds}s", flush=True)
    if a.fork_grandchild:
        subprocess.Popen([sys.executable, "-c", GRANDCHILD, a.fork_grandchild])
    time.sleep(a.load_seconds)
    server = ThreadingHTTPServer((a.host, a.port), _Handler)
    server.daemon_threads = True
    _State.ready_at = time.monotonic()
    _State.unhealthy_after, _State.hang_after = a.unhealthy_after, a.hang_after
    _State.close_log = a.close_log
    _after(a.crash_after, 1)
    _after(a.exit0_after, 0)
    print(f"serving on {a.host}:{a.port}", flush=True)
    server.serve_forever()


# --- helpers for tests -------------------------------------------------------------------



def command(port: int, *flags: str) -> tuple[str, ...]:
    """The argv that runs this stand-in, as ``vllm serve ...`` would be run."""
    return (sys.executable, str(SCRIPT), "--port", str(port), *flags)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def pids_in(path: Path) -> list[int]:
    """Pids written one per line into ``path`` (empty when it does not exist)."""
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


async def wait_gone(pids: Iterable[int], within: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` has a /proc entry (zombies count as present); return the
    survivors."""
    deadline = time.monotonic() + within
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if Path(f"/proc/{p}").exists()]
        await asyncio.sleep(0.02)
    return left


if __name__ == "__main__":
    main()

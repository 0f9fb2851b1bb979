"""The running daemon's status server against malformed and slow requests, sent as raw bytes:
each is answered with a 4xx and costs at most one line of the daemon's JSON log, never a
traceback; an idle or slow client is let go; the server keeps serving."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.daemon import DaemonProcess, write_config

from traind.status.server import IDLE_TIMEOUT

MALFORMED = {
    "unknown HTTP version": b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    "1 MiB header": b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
    "huge query string": b"GET /status?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad method": b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n",
    "garbage after a good request":
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\x13junk\r\n\r\n",
    "header without a colon": b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    "TLS hello": bytes.fromhex("160301020001") + b"\x00" * 64,
}
"""What a confused client, a scanner or a fuzzer sends."""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, int]]:
    """traind watching output_dir with a local store; its status port. Stopped on the way out."""
    cfg = write_config(tmp_path / "traind.toml", run="exp", output_dir=tmp_path / "out",
                       state_dir=tmp_path / "state",
                       storage=f'type = "local"\npath = "{tmp_path / "store"}"\n')
    proc = DaemonProcess(cfg)
    try:
        listen = proc.wait_for("status_server_started", timeout=60)["listen"]
        yield proc, int(listen.rpartition(":")[2])
    finally:
        proc.stop(timeout=30)


def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a new connection and read the whole answer, within 10 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)  # may be answered and closed before all of it is sent
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def last_status(answer: bytes) -> int:
    """The status code of the last response in ``answer`` (its body may quote the request)."""
    return int(re.findall(rb"(?:^|\n)HTTP/1\.[01] (\d{3}) ", answer)[-1])


def test_malformed_requests_get_a_4xx_and_one_log_line_each(
    daemon: tuple[DaemonProcess, int],
) -> None:
    """Every malformed request is answered 4xx; the daemon's log gains at most one line for
    each, JSON like every other, and no traceback."""
    proc, port = daemon
    before = len(proc.raw)
    for name, request in MALFORMED.items():
        answer = exchange(port, request)
        assert answer.startswith(b"HTTP/1."), (name, answer[:200])
        assert 400 <= last_status(answer) < 500, (name, answer[:300])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        assert response.status == 200
    proc.stop(timeout=30)
    during = proc.raw[before:]
    assert "Traceback" not in "".join(during)
    events = [json.loads(line) for line in during]  # JSON every one: no traceback, no text
    about = [e for e in events if e["event"].startswith("status_request")]
    assert len(about) <= len(MALFORMED)
    assert {e["event"] for e in about} <= {"status_request_refused"}
    assert all(400 <= e["status"] < 500 for e in about)

def test_an_idle_or_slow_client_is_let_go(daemon: tuple[DaemonProcess, int]) -> None:
    """A connection that never completes its request is closed after the idle timeout, and
    the server answers others meanwhile."""
    _, port = daemon
    with (socket.create_connection(("127.0.0.1", port), timeout=10) as idle,
          socket.create_connection(("127.0.0.1", port), timeout=10) as slow):
        slow.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")  # and never the end
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200
        for sock in (idle, slow):
            sock.settimeout(IDLE_TIMEOUT + 10)
            assert sock.recv(1024) == b""  # closed by the server
        assert time.monotonic() - started < IDLE_TIMEOUT + 10

"""sd_notify: the datagrams systemd would receive, on a path socket and an abstract one."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from traind.util.proc.systemd import Notifier, watchdog_interval


class Receiver:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, address: str) -> None:
        self.address = address  # as $NOTIFY_SOCKET spells it
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.setblocking(False)

    def notifier(self, **env: str) -> Notifier:
        return Notifier({"NOTIFY_SOCKET": self.address, **env})

    async def next(self) -> dict[str, str]:
        """The next message (within 2 s) as a dict of its assignments."""
        async with asyncio.timeout(2):
            data = await asyncio.get_running_loop().sock_recv(self.sock, 4096)
        return dict(line.split("=", 1) for line in data.decode().splitlines())

    def pending(self) -> list[bytes]:
        """Every datagram already queued, without waiting."""
        out = []
        with contextlib.suppress(BlockingIOError):
            while True:
                out.append(self.sock.recv(4096))
        return out


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Receiver]:
    """A receiving socket bound to a filesystem path or in the abstract namespace."""
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
    else:
        address = f"@traind-test-{uuid.uuid4().hex}"
    r = Receiver(address)
    yield r
    r.sock.close()


async def test_ready_with_status(receiver: Receiver) -> None:
    """READY=1 and the STATUS line arrive in one datagram."""
    assert receiver.notifier().ready("watching /data/out")
    assert await receiver.next() == {"READY": "1", "STATUS": "watching /data/out"}


async def test_status_is_one_line(receiver: Receiver) -> None:
    """A multi-line status is flattened so it cannot inject other assignments."""
    receiver.notifier().status("uploading checkpoint-4\nREADY=1")
    assert await receiver.next() == {"STATUS": "uploading checkpoint-4 READY=1"}


async def test_stopping(receiver: Receiver) -> None:
    """STOPPING=1 is sent as is."""
    receiver.notifier().stopping()
    assert await receiver.next() == {"STOPPING": "1"}


async def test_reload_sequence(receiver: Receiver) -> None:
    """RELOADING=1 carries MONOTONIC_USEC from CLOCK_MONOTONIC; READY=1 ends the reload."""
    notifier = receiver.notifier()
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.ready("reloaded")
    reloading = await receiver.next()
    assert reloading["RELOADING"] == "1"
    assert before <= int(reloading["MONOTONIC_USEC"]) <= after
    assert (await receiver.next())["READY"] == "1"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}, 0.1),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "sixty"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    """Half of WATCHDOG_USEC, only when WATCHDOG_PID is unset or ours."""
    assert watchdog_interval(env) == expected


async def test_watchdog_pings_at_half_the_period(receiver: Receiver) -> None:
    """With WATCHDOG_USEC=200ms the loop sends WATCHDOG=1 every 100ms."""
    notifier = receiver.notifier(WATCHDOG_USEC="200000")
    task = asyncio.create_task(notifier.watchdog_loop())
    try:
        arrivals = []
        for _ in range(5):
            assert await receiver.next() == {"WATCHDOG": "1"}
            arrivals.append(time.monotonic())
    finally:
        task.cancel()
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert 0.09 <= sum(gaps) / len(gaps) <= 0.2, gaps  # loose upper bound: a busy CI host
    assert all(g <= 0.4 for g in gaps), gaps


async def test_blocked_loop_stops_the_pings(receiver: Receiver) -> None:
    """Pings come from the event loop, so a blocked loop sends none and systemd notices."""
    notifier = receiver.notifier(WATCHDOG_USEC="100000")
    task = asyncio.create_task(notifier.watchdog_loop())
    try:
        await receiver.next()
        receiver.pending()
        time.sleep(0.3)  # noqa: ASYNC251 - the point: block the loop for six intervals
        assert receiver.pending() == []
        assert await receiver.next() == {"WATCHDOG": "1"}
    finally:
        task.cancel()


async def test_without_notify_socket_nothing_happens() -> None:
    """Outside systemd every call is a no-op and the watchdog loop returns at once."""
    notifier = Notifier({"WATCHDOG_USEC": "100000"})
    assert not notifier.enabled
    assert not notifier.ready()
    async with asyncio.timeout(1):
        await notifier.watchdog_loop()


def test_send_failure_warns_once_and_never_raises(tmp_path: Path) -> None:
    """A vanished socket is logged once as a warning; the daemon is never disturbed."""
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with capture_logs() as logs:
        results = [notifier.watchdog(), notifier.status("x"), notifier.stopping()]
    assert results == [False, False, False]
    assert [e["event"] for e in logs] == ["sd_notify_failed"]
    assert logs[0]["log_level"] == "warning"

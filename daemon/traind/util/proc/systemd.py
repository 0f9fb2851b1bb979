"""sd_notify: tell systemd we are ready, reloading, stopping and alive.

Each message is one datagram to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace). Without that variable every call is a no-op, so the daemon runs the same outside
systemd. Sending never raises: a failure is logged once and the daemon carries on.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("traind.systemd")


def socket_address(value: str) -> str:
    """The address to send to: ``@name`` becomes the abstract socket ``\\0name``."""
    return "\0" + value[1:] if value.startswith("@") else value


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of ``$WATCHDOG_USEC``), or None when systemd
    does not expect them from this process (unset, invalid, or ``$WATCHDOG_PID`` is another)."""
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2 / 1e6 if usec > 0 else None


class Notifier:
    """Sends sd_notify messages; a no-op when the daemon was not started by systemd."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.socket = env.get("NOTIFY_SOCKET") or None
        self.interval = watchdog_interval(env)
        self._warned = False

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify."""
        return self.socket is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; True if it was sent."""
        if self.socket is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)  # a full receive queue must not block the loop
                sock.sendto(message, socket_address(self.socket))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify_failed", socket=self.socket, error=str(exc))
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: start-up (or a reload) is finished."""
        return self.send("READY=1", *([_status(status)] if status is not None else []))

    def status(self, text: str) -> bool:
        """``STATUS=``: one line a person reads in ``systemctl status``."""
        return self.send(_status(text))

    def stopping(self) -> bool:
        """``STOPPING=1``: shutdown has begun."""
        return self.send("STOPPING=1")

    def reloading(self) -> bool:
        """``RELOADING=1`` with the ``MONOTONIC_USEC`` systemd ≥ 253 requires; send
        ``ready()`` when the reload is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the daemon is alive."""
        return self.send("WATCHDOG=1")

    async def watchdog_loop(self) -> None:
        """Ping the watchdog from the event loop at half its period, until cancelled.

        Returns at once when no watchdog is expected. A blocked loop stops the pings, so
        systemd restarts a daemon that hangs.
        """
        if self.interval is None or not self.enabled:
            return
        log.info("watchdog_started", interval=self.interval)
        while True:
            self.watchdog()
            await asyncio.sleep(self.interval)


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.splitlines())

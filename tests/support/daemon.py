"""Run the real ``traind`` CLI as a subprocess and follow its JSON log events."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.net import free_port

Event = dict[str, Any]


def is_event(name: str, **fields: object) -> Callable[[Event], bool]:
    """A ``wait_for`` predicate: an event ``name`` whose ``fields`` have these values."""
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


TESTS_NICE = "transfer_nice = 0\n"
"""In ``write_config``'s [run]: a test's daemon shares two cores with the servers and the
test it runs beside, and its timing bounds assume it is not ranked below them."""


def write_config(
    path: Path,
    *,
    run: str,
    output_dir: Path,
    state_dir: Path,
    storage: str,
    extra: str = "",
    status_port: int | None = None,
) -> Path:
    """Write a traind TOML config with short timings suitable for tests (the status
    server on a free loopback port unless ``status_port`` is given)."""
    port = status_port or free_port()
    path.write_text(
        f"""
[run]
name = "{run}"
output_dir = "{output_dir}"
state_dir = "{state_dir}"
stop_timeout = "10s"
{TESTS_NICE}
[checkpoints]
settle = "1s"
poll_interval = "200ms"

[storage]
{storage}

[retention]
keep_last = 100
keep_local = 100
interval = "1h"

[status]
listen = "127.0.0.1:{port}"

{extra}
"""
    )
    return path


class DaemonProcess:
    """``traind run -c CONFIG`` in its own process group, with its events collected;
    ``wrapper`` is a command that runs it (``unshare ... --``)."""

    def __init__(
        self, config: Path, env: dict[str, str] | None = None, args: Sequence[str] = (),
        wrapper: Sequence[str] = (),
    ) -> None:
        self.config = config
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "traind", "run", "-c", str(config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            text=True,
        )
        self.events: list[Event] = []
        self.raw: list[str] = []
        self._new: queue.Queue[Event] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.events.append(event)
            self._new.put(event)

    def wait_for(self, predicate: Callable[[Event], bool] | str, timeout: float = 30) -> Event:
        """Wait for the first event (past or future) matching ``predicate`` (or event name)."""
        match = (lambda e: e.get("event") == predicate) if isinstance(predicate, str) else predicate
        deadline = time.monotonic() + timeout
        for e in list(self.events):
            if match(e):
                return e
        while (left := deadline - time.monotonic()) > 0:
            try:
                e = self._new.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None and self._new.empty():
                    break
                continue
            if match(e):
                return e
        raise TimeoutError(f"no matching event within {timeout}s; log:\n{''.join(self.raw[-40:])}")

    def named(self, name: str) -> list[Event]:
        """All events so far with this event name."""
        return [e for e in self.events if e.get("event") == name]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` and wait for exit; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group (idempotent)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)

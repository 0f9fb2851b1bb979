"""A child's output: read as it arrives (a full pipe freezes a child), split into lines and
kept in size-rotated files.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from logging.handlers import QueueListener, RotatingFileHandler
from pathlib import Path

MAX_LINE = 64 * 1024


class Pipes(asyncio.SubprocessProtocol):
    """Splits stdout and stderr into lines as they arrive."""

    def __init__(
        self, on_line: Callable[[int, str, bytes], None], on_exit: Callable[[int, int], None]
    ) -> None:
        self._on_line = on_line
        self._on_exit = on_exit
        self._partial = {1: b"", 2: b""}
        self._transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        stream = "stdout" if fd == 1 else "stderr"
        *lines, rest = (self._partial[fd] + data).split(b"\n")
        if len(rest) > MAX_LINE:
            lines.append(rest)
            rest = b""
        self._partial[fd] = rest
        for line in lines:
            self._on_line(self._pid, stream, line)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if rest := self._partial.pop(fd, b""):
            self._on_line(self._pid, "stdout" if fd == 1 else "stderr", rest)

    def process_exited(self) -> None:
        assert self._transport is not None
        code = self._transport.get_returncode()
        self._on_exit(self._pid, -1 if code is None else code)

    @property
    def _pid(self) -> int:
        return self._transport.get_pid() if self._transport is not None else 0


class ChildLog:
    """Appends a child's output to ``<dir>/<name>.log``, rotated by size, from a thread."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True
        )
        self._handler.setFormatter(
            logging.Formatter("%(asctime)s pid=%(child_pid)s %(stream)s %(message)s")
        )
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._listener = QueueListener(self._queue, self._handler)
        self._listener.start()

    def write(self, pid: int, stream: str, line: str) -> None:
        """Queue one line; never blocks the loop."""
        rec = logging.makeLogRecord({"msg": line, "child_pid": pid, "stream": stream})
        self._queue.put_nowait(rec)

    def close(self) -> None:
        """Flush and close (blocking: run in a thread)."""
        self._listener.stop()
        self._handler.close()

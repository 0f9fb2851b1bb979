"""Byte progress for uploads and downloads: a bar on a TTY, periodic log events otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

from traind.util.units import format_size


class Progress:
    """Counts bytes moved; safe to ``advance`` from worker threads."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def advance(self, nbytes: int) -> None:
        """Add ``nbytes`` moved (called from threads; an int add is atomic enough here)."""
        self.done += nbytes

    @property
    def rate(self) -> float:
        """Bytes per second so far."""
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the current rate, if known."""
        rate = self.rate
        return (self.total - self.done) / rate if rate > 0 else None

    def line(self, width: int = 30) -> str:
        """A one-line bar: ``[#####.....]  45%  1.2 GiB/2.5 GiB  180 MB/s  ETA 7s``."""
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        filled = int(frac * width)
        eta = self.eta
        eta_s = f"ETA {eta:.0f}s" if eta is not None else "ETA ?"
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}%  "
            f"{format_size(self.done)}/{format_size(self.total)}  "
            f"{self.rate / 1e6:.0f} MB/s  {eta_s}"
        )


@asynccontextmanager
async def shown(
    progress: Progress,
    label: str,
    stream: TextIO | None = None,
    *,
    bar: bool | None = None,
    log_every: float = 5.0,
) -> AsyncIterator[Progress]:
    """Show ``progress`` while the block runs: a redrawn bar (default: when ``stream`` is a
    TTY), else a ``transfer_progress`` log event every ``log_every`` seconds."""
    import asyncio  # here, like structlog: ``traind status`` draws a Progress, never shows one

    import structlog

    log = structlog.get_logger("traind.progress")
    out = stream or sys.stderr
    tty = out.isatty() if bar is None else bar

    async def render() -> None:
        while True:
            await asyncio.sleep(0.2 if tty else log_every)
            if tty:
                out.write(f"\r{label} {progress.line()}")
                out.flush()
            else:
                eta = progress.eta
                log.info(
                    "transfer_progress", what=label, bytes_done=progress.done,
                    bytes_total=progress.total, mb_per_s=round(progress.rate / 1e6, 1),
                    eta_seconds=round(eta) if eta is not None else None,
                )

    task = asyncio.create_task(render())
    try:
        yield progress
    finally:
        task.cancel()
        if tty:
            out.write(f"\r{label} {progress.line()}\n")
            out.flush()

"""The checkpoints waiting to be committed: queued in the order they became ready (the
newest first once asked), each pending until it is committed or let go, and set aside
(parked) while the disk is full."""

from __future__ import annotations

import asyncio

from traind.checkpoints.intake.watcher import parse_step


def _step(tag: str) -> int:
    return parse_step(tag) or 0


class CommitQueue:
    """Tags to commit: queued, in flight, or waiting to be tried again — ``pending`` until
    committed or let go (a let-go tag's queue entries are skipped)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self.pending: set[str] = set()
        self.parked: set[str] = set()
        """Pending tags held back while only the newest is committed (the disk is full)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._newest_first = False

    @property
    def queued(self) -> int:
        """How many entries wait in the queue."""
        return self._queue.qsize()

    @property
    def unstored(self) -> list[str]:
        """The pending tags, newest first."""
        return sorted(self.pending, key=_step, reverse=True)

    def put(self, tag: str) -> None:
        """Queue ``tag``, pending from now on."""
        self.pending.add(tag)
        self._idle.clear()
        self._queue.put_nowait(tag)

    async def again(self, delay: float, tag: str) -> None:
        """Queue ``tag`` again after ``delay`` seconds (it stays pending meanwhile)."""
        await asyncio.sleep(delay)
        self._queue.put_nowait(tag)

    async def next(self) -> str:
        """The next queued tag: the first in, or the newest once ``prefer_newest``."""
        tag = await self._queue.get()
        if not self._newest_first:
            return tag
        waiting = [tag]
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        waiting.sort(key=_step)
        for older in waiting[:-1]:
            self._queue.put_nowait(older)
        return waiting[-1]

    def prefer_newest(self) -> None:
        """From now on take the newest queued tag first."""
        self._newest_first = True

    def done(self, tag: str) -> None:
        """``tag`` is pending no more (committed, let go, another's)."""
        self.pending.discard(tag)
        self.parked.discard(tag)
        if not self.pending:
            self._idle.set()

    def unpark(self) -> None:
        """Queue every parked tag still pending again, oldest first."""
        parked, self.parked = self.parked, set()
        for tag in sorted(parked & self.pending, key=_step):
            self._queue.put_nowait(tag)

    def settle(self) -> None:
        """Mark the queue idle when nothing is pending (after an attempt)."""
        if not self.pending:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once nothing is pending."""
        await self._idle.wait()

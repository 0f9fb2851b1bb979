"""Moving bytes cheaply, whichever client sends them: reusable part buffers, reading a part
hashed, a bandwidth cap."""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import mmap
import os
import time
from typing import Any

from traind.util.fileio import SharedFd

try:
    # ISA-L's CRC32 (the [s3] extra): a fraction of zlib's CPU (bench/README.md).
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the same checksum, only slower
    from zlib import crc32


MAX_PARTS = 10_000
MIB = 1024 * 1024
INLINE_READ = 256 * 1024
"""Files up to this size are read and hashed on the event loop: for a checkpoint of many
small files, a hop to a worker thread per file costs more than the read itself."""
SMALL_FILES_PER_SLOT = 16
"""Files sent in one PUT go this many per ``concurrency`` slot: each is one short request,
so its time is mostly waiting for the store's answer, and more of them in flight keep the
connections busy (their bytes stay within ``upload_memory``)."""


class BufferPool:
    """Buffers of at most ``budget`` bytes in all, handed out and kept for reuse, not
    reallocated; a request waits, in order, until its size fits (one larger than the whole
    budget is given alone).

    Bounded by bytes, not count, so whole small files (DCP/ZeRO shards) can be in flight by
    the hundred in the memory a few parts take. Reuse matters: a fresh 16 MiB buffer per
    part costs thousands of page faults. Buffers are anonymous maps (``new_buffer``), so
    page-aligned as direct I/O needs (``fileio.direct_io``).
    """

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._used = 0
        """Bytes of the buffers handed out."""
        self._free: list[mmap.mmap] = []
        self._cached = 0
        """Bytes of the buffers in ``_free``."""
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = (
            collections.deque())

    def _fits(self, size: int) -> bool:
        return self._used == 0 or self._used + size <= self._budget

    async def acquire(self, size: int) -> mmap.mmap:
        """Wait until ``size`` bytes fit the budget; return a buffer of at least that many."""
        size = max(size, 1)
        if self._waiting or not self._fits(size):
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append((size, waiter))
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._used -= size  # granted just as it was cancelled: give it back
                elif (size, waiter) in self._waiting:
                    self._waiting.remove((size, waiter))
                self._wake()
                raise
        else:
            self._used += size
        return self._take(size)

    def _take(self, size: int) -> mmap.mmap:
        """A buffer for ``size`` bytes already counted in ``_used``: the smallest free one
        that fits without overrunning the budget, else a new one (dropping free ones)."""
        fit = [b for b in self._free if size <= len(b) <= self._budget - self._used + size]
        if fit:
            buf = min(fit, key=len)
            self._free.remove(buf)
            self._cached -= len(buf)
            self._used += len(buf) - size
            return buf
        self._free.sort(key=len)
        while self._free and self._used + self._cached > self._budget:
            self._cached -= len(self._free.pop())
        return new_buffer(size)

    def release(self, buf: mmap.mmap) -> None:
        """Give a buffer back."""
        self._used -= len(buf)
        self._free.append(buf)
        self._cached += len(buf)
        self._wake()

    def _wake(self) -> None:
        """Grant waiting requests, first come first served, while they fit."""
        while self._waiting and self._fits(self._waiting[0][0]):
            size, waiter = self._waiting.popleft()
            if not waiter.done():
                self._used += size
                waiter.set_result(None)


class TokenBucket:
    """Caps throughput at ``rate`` bytes/s on average, with bursts of up to one second."""

    def __init__(self, rate: int) -> None:
        self._rate = float(rate)
        self._tokens = float(rate)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be sent."""
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self._rate, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            self._tokens -= nbytes
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self._rate)


def new_buffer(size: int) -> mmap.mmap:
    """A private anonymous map of ``size`` bytes, its pages allocated up front.

    ``mmap``'s default, a shared map, is backed by shmem, whose pages cost more to fault in
    and to pin for direct I/O; and one populating call allocates the pages for less than a
    page fault on each first touch would (every buffer is filled whole).
    """
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, size, flags=flags)


def read_part(
    file: SharedFd, offset: int, view: memoryview, digest: Any, crc: bool
) -> str | None:
    """Fill ``view`` from ``file`` at ``offset``, feed it to ``digest`` (blocking; in a
    thread).

    Returns the part's base64 CRC32 when ``crc`` is set (the S3 ``ChecksumCRC32`` form).
    """
    with file.using() as fd:
        filled = 0
        while filled < len(view):
            n = os.preadv(fd, [view[filled:]], offset + filled)
            if n == 0:
                raise OSError(f"file shrank while reading at offset {offset + filled}")
            filled += n
    digest.update(view)
    if not crc:
        return None
    return base64.b64encode(crc32(view).to_bytes(4, "big")).decode()


def read_whole(path: os.PathLike[str] | str, view: memoryview, digest: Any, crc: bool
               ) -> str | None:
    """``read_part`` of a whole file from its start into ``view`` (blocking; in a thread
    unless small)."""
    file = SharedFd(os.open(path, os.O_RDONLY))
    try:
        return read_part(file, 0, view, digest, crc)
    finally:
        file.close()


def new_digest() -> Any:
    """A fresh sha256 object (typed loosely: hashlib's type is private)."""
    return hashlib.sha256()


def part_size_for(size: int, configured: int) -> int:
    """The configured part size, grown (in whole MiB) if the file needs over 10,000 parts."""
    if size <= configured * MAX_PARTS:
        return configured
    need = -(-size // MAX_PARTS)
    return -(-need // MIB) * MIB

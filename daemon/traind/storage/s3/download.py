"""Restoring one file: concurrent ranged GETs, each received whole into a buffer, written
at its offset and hashed in order from memory.

A range's body is copied from the response stream (aiobotocore's ``get_object``) chunk by
chunk into a pooled, page-aligned buffer, which one worker-thread call writes with direct
I/O (``fileio.direct_io``) and, once every earlier range of the file has been hashed,
hashes. So each byte is hashed from memory; it is never read back from the file, and never
copied into new page-cache pages.

A buffer waits for the earlier ranges of its file to be hashed, so a file's ranges take
buffers in order (no range holds one while an earlier range waits for one). Each GET holds a
buffer, so the ``BufferPool``'s count also bounds the GETs in flight, and a restore holds at
most that count times ``RANGE_SIZE`` bytes.

Files are not fsynced here: making the restored tree durable before the rename into place
is one step for the caller, whatever the backend.
"""

from __future__ import annotations

import asyncio
import mmap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traind.errors import IntegrityError
from traind.storage.s3.buffers import BufferPool, TokenBucket, new_digest
from traind.storage.s3.client import Ops
from traind.storage.s3.errors import BOTOCORE
from traind.storage.s3.target import retrying
from traind.util.fileio import SharedFd, create, local_errors, trim, write_at
from traind.util.tasks import task_group

RANGE_SIZE = 12 * 1024 * 1024
"""Bytes per ranged GET, and per buffer (a multiple of ``ALIGN``): large enough that the
per-request cost (client and server) is small per byte, small enough that ``concurrency``
buffers stay a modest part of a restore's memory."""


class Assembler:
    """One file written range by range, in any order, and hashed in order (thread-safe).

    It owns the file's descriptor (a ``SharedFd``): ``close`` closes it once no ``put`` or
    ``finish`` is still running in a worker thread.
    """

    def __init__(self, fd: int, size: int) -> None:
        self._file = SharedFd(fd)
        self.size = size
        self._digest = new_digest()
        self._hashed = 0
        self._pending: dict[int, tuple[mmap.mmap, int]] = {}
        self._hashing = False
        self._lock = threading.Lock()
        self.direct = self._file.direct_io()

    @classmethod
    def create(cls, target: Path, size: int) -> Assembler:
        """Create ``target`` for ``size`` bytes (``fileio.create``; blocking: in a thread)."""
        return cls(create(target, size), size)

    def put(self, offset: int, buf: mmap.mmap, length: int) -> list[mmap.mmap]:
        """Write ``length`` bytes of ``buf`` at ``offset``; hash as far as ranges are now
        contiguous; return the buffers hashed here (free to reuse). ``buf`` itself may be
        hashed, and returned, by whichever call completes the range before it."""
        with self._file.using() as fd:
            self._write(fd, offset, buf, length)
            return self._hash_ready(offset, buf, length)

    def _hash_ready(self, offset: int, buf: mmap.mmap, length: int) -> list[mmap.mmap]:
        with self._lock:
            self._pending[offset] = (buf, length)
        done: list[mmap.mmap] = []
        # One thread hashes at a time; whoever finishes hashing looks again, so a range
        # registered meanwhile is never left behind.
        while True:
            with self._lock:
                if self._hashing or self._hashed not in self._pending:
                    return done
                self._hashing = True
                start = self._hashed
                ready, n = self._pending.pop(start)
            try:
                self._digest.update(memoryview(ready)[:n])
                done.append(ready)
                with self._lock:
                    self._hashed = start + n
            finally:
                with self._lock:
                    self._hashing = False

    def _write(self, fd: int, offset: int, buf: mmap.mmap, length: int) -> None:
        direct = write_at(fd, memoryview(buf), length, offset, self.direct)
        if not direct and self.direct:
            with self._lock:
                self.direct = False

    def finish(self) -> str:
        """The file's sha256, once every byte has been written and hashed; cuts the padding
        of a direct tail."""
        with self._file.using() as fd:
            if self._hashed != self.size:
                raise IntegrityError(f"assembled {self._hashed} of {self.size} bytes")
            trim(fd, self.size)
            return str(self._digest.hexdigest())

    def close(self) -> None:
        """Give up the descriptor: closed now, or by the last call still running."""
        self._file.close()


async def fetch_file(
    ops: Ops,
    key: str,
    target: Path,
    size: int,
    pool: BufferPool,
    range_size: int,
    advance: Callable[[int], None],
    bandwidth: TokenBucket | None,
) -> str:
    """Download ``key`` (``size`` bytes per the manifest) to ``target``; return its sha256.

    Ranges of ``range_size`` bytes (an ``ALIGN`` multiple, at most the ``pool``'s buffers)
    are received into buffers taken from ``pool``, one GET per buffer at a time.
    """
    with local_errors("write", target):
        asm = await asyncio.to_thread(Assembler.create, target, size)
        try:
            async with task_group() as tg:
                for start in range(0, size, range_size):
                    buf = await pool.acquire(range_size)  # in order: see the docstring
                    tg.create_task(_fetch_range(ops, key, asm, buf, start,
                                                min(size, start + range_size), pool, advance,
                                                bandwidth))
            return await asyncio.to_thread(asm.finish)
        finally:
            asm.close()


async def _fetch_range(
    ops: Ops,
    key: str,
    asm: Assembler,
    buf: mmap.mmap,
    start: int,
    end: int,
    pool: BufferPool,
    advance: Callable[[int], None],
    bandwidth: TokenBucket | None,
) -> None:
    pos = start  # bytes before pos are in buf (kept across retries)
    view = memoryview(buf)

    def deadline() -> float:
        return ops.read_timeout * 2 + (end - pos) / (64 * 1024)

    async def attempt() -> None:
        nonlocal pos
        resp = await ops.client.get_object(
            Bucket=ops.target.bucket, Key=key, Range=f"bytes={pos}-{end - 1}"
        )
        body = resp["Body"]
        try:
            _check_range(resp, key, pos, end, asm.size)
            stream = body.raw_stream.content
            async with asyncio.timeout(deadline()):
                while True:
                    chunk, boundary = await stream.readchunk()
                    if not chunk:
                        if boundary:
                            continue
                        break
                    if len(chunk) > end - pos:
                        raise ConnectionResetError(f"stream for {key} ran past byte {end}")
                    view[pos - start : pos - start + len(chunk)] = chunk
                    pos += len(chunk)
            if pos < end:
                raise ConnectionResetError(f"stream for {key} ended at {pos} of {end}")
        finally:
            body.close()

    if bandwidth is not None:
        await bandwidth.take(end - start)
    await retrying(attempt, "get_object", key, ops.target, ops.policy, BOTOCORE)
    for done in await asyncio.to_thread(asm.put, start, buf, end - start):
        pool.release(done)
    advance(end - start)


def _check_range(resp: dict[str, Any], key: str, pos: int, end: int, size: int) -> None:
    """Refuse a response that is not exactly the bytes asked for of a ``size``-byte object.

    A chunked body has no Content-Length: its Content-Range then says which bytes come, and
    the stream's end is checked as it is read.
    """
    sent, _, total = str(resp.get("ContentRange", "")).partition("/")
    length = int(resp.get("ContentLength", -1))
    if length < 0 and sent.removeprefix("bytes ").strip() == f"{pos}-{end - 1}":
        length = end - pos
    if (total and total != str(size)) or length != end - pos:
        raise IntegrityError(
            f"s3 object {key} does not match its manifest: asked bytes {pos}-{end - 1} of "
            f"{size}, got {length} bytes of {total or 'unknown'}"
        )


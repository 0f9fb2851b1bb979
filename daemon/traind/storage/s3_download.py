"""Restoring one file: concurrent ranged GETs written at their offsets, hashed in order.

Each range is streamed into the destination with ``pwritev`` in batches. The file's sha256
advances whenever the bytes from the hashed point on are contiguous: from the batch in
memory when it is the next one, otherwise by reading the already-written ranges back (they
are in the page cache). So hashing overlaps the transfer, and what is hashed is what was
written. Files are not fsynced here: making the restored tree durable before the rename
into place is one step for the caller, whatever the backend.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from traind.errors import IntegrityError, StorageError
from traind.storage.fileio import WRITE_PIECE, create
from traind.storage.s3_client import Ops
from traind.storage.s3_direct import Direct
from traind.storage.s3_errors import retrying
from traind.storage.s3_io import TokenBucket, new_digest
from traind.storage.tasks import task_group

FLUSH = 1024 * 1024
"""Bytes gathered from the network before one ``pwritev`` in a worker thread. Small keeps
the received buffers hot and reused: 8 MiB batches measured twice the CPU per byte."""
READBACK = 1024 * 1024
RANGE_SIZE = 32 * 1024 * 1024
"""Bytes per ranged GET, at least (a larger part size is used as is): fewer requests."""


class Assembler:
    """One file being filled out of order and hashed in order (thread-safe)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self.size = size
        self._digest = new_digest()
        self._hashed = 0
        self._written: dict[int, int] = {}
        self._hashing = False
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._scratch: bytearray | None = None

    def write(self, offset: int, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write ``chunks`` at ``offset`` and advance the hash as far as bytes are contiguous."""
        length = sum(map(len, chunks))
        done = 0
        # Concurrent writers to one file spin on its inode lock in the kernel; a lock
        # here lets them sleep instead, which measured cheaper.
        with self._write_lock:
            while done < length:
                done += os.pwritev(self._fd, _skip(chunks, done, WRITE_PIECE), offset + done)
        with self._lock:
            self._written[offset] = length
        # One thread hashes at a time; whoever finishes a range looks again, so a range
        # registered while another thread was hashing is never left behind.
        while True:
            with self._lock:
                if self._hashing or self._hashed not in self._written:
                    return
                self._hashing = True
                start = self._hashed
                size = self._written.pop(start)
            try:
                if start == offset:
                    for chunk in chunks:
                        self._digest.update(chunk)
                else:
                    self._read_back(start, size)
                with self._lock:
                    self._hashed = start + size
            finally:
                with self._lock:
                    self._hashing = False

    def _read_back(self, start: int, length: int) -> None:
        if self._scratch is None:
            self._scratch = bytearray(READBACK)
        view = memoryview(self._scratch)
        end = start + length
        while start < end:
            n = os.preadv(self._fd, [view[: min(READBACK, end - start)]], start)
            if n == 0:
                raise OSError(f"short read-back at {start}")
            self._digest.update(view[:n])
            start += n

    def hexdigest(self) -> str:
        """The file's sha256, once every byte has been written and hashed."""
        if self._hashed != self.size:
            raise IntegrityError(f"assembled {self._hashed} of {self.size} bytes")
        return str(self._digest.hexdigest())


def _skip(
    chunks: Sequence[bytes | bytearray | memoryview], done: int, limit: int
) -> list[memoryview]:
    """At most ``limit`` bytes of ``chunks`` after the first ``done`` bytes."""
    out: list[memoryview] = []
    for chunk in chunks:
        if done >= len(chunk):
            done -= len(chunk)
            continue
        out.append(memoryview(chunk)[done : done + limit])
        limit -= len(out[-1])
        done = 0
        if not limit:
            break
    return out


async def fetch_file(
    ops: Ops,
    key: str,
    target: Path,
    size: int,
    range_size: int,
    limit: asyncio.Semaphore,
    advance: Callable[[int], None],
    bandwidth: TokenBucket | None,
    direct: Direct | None = None,
) -> str:
    """Download ``key`` (``size`` bytes per the manifest) to ``target``; return its sha256.

    Ranges are received by ``direct`` when given (``s3_direct``), else through aiobotocore.
    """
    fd = await asyncio.to_thread(create, target, size)
    try:
        asm = Assembler(fd, size)
        async with task_group() as tg:
            for start in range(0, size, range_size):
                end = min(size, start + range_size)
                tg.create_task(
                    _fetch_range(ops, key, asm, start, end, limit, advance, bandwidth, direct)
                )
        return asm.hexdigest()
    except OSError as exc:
        if isinstance(exc, ConnectionError):
            raise
        raise StorageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


async def _fetch_range(
    ops: Ops,
    key: str,
    asm: Assembler,
    start: int,
    end: int,
    limit: asyncio.Semaphore,
    advance: Callable[[int], None],
    bandwidth: TokenBucket | None,
    direct: Direct | None,
) -> None:
    pos = start

    async def direct_attempt() -> None:
        nonlocal pos
        assert direct is not None
        body = await direct.get(key, pos, end)
        try:
            head = body.response
            _check_range({"ContentRange": head.headers.get("content-range", ""),
                          "ContentLength": head.length}, key, pos, end, asm.size)
            async with asyncio.timeout(ops.read_timeout * 2 + (end - pos) / (64 * 1024)):
                while (got := await body.chunk(ops.read_timeout)) is not None:
                    buf, n = got
                    try:
                        await asyncio.to_thread(asm.write, pos, (memoryview(buf)[:n],))
                    finally:
                        body.release(buf)
                    pos += n
                    advance(n)
            if pos < end:
                raise ConnectionResetError(f"stream for {key} ended at {pos} of {end}")
        finally:
            body.close()

    async def attempt() -> None:
        nonlocal pos
        resp = await ops.client.get_object(
            Bucket=ops.target.bucket, Key=key, Range=f"bytes={pos}-{end - 1}"
        )
        body = resp["Body"]
        try:
            _check_range(resp, key, pos, end, asm.size)
            stream = body.raw_stream.content
            batch: list[bytes] = []
            pending = 0
            async with asyncio.timeout(ops.read_timeout * 2 + (end - pos) / (64 * 1024)):
                while True:
                    chunk, boundary = await stream.readchunk()
                    if not chunk:
                        if boundary:
                            continue
                        break
                    batch.append(chunk)
                    pending += len(chunk)
                    if pending >= FLUSH or pos + pending >= end:
                        await asyncio.to_thread(asm.write, pos, batch)
                        pos += pending
                        advance(pending)
                        batch, pending = [], 0
            if pos < end or pending:
                raise ConnectionResetError(f"stream for {key} ended at {pos + pending} of {end}")
        finally:
            body.close()

    async with limit:
        if bandwidth is not None:
            await bandwidth.take(end - start)
        await retrying(attempt if direct is None else direct_attempt, "get_object", key,
                       ops.target, ops.policy)


def _check_range(resp: dict[str, Any], key: str, pos: int, end: int, size: int) -> None:
    """Refuse a response that is not exactly the bytes asked for of a ``size``-byte object."""
    total = str(resp.get("ContentRange", "")).rpartition("/")[2]
    length = int(resp.get("ContentLength", -1))
    if (total and total != str(size)) or length != end - pos:
        raise IntegrityError(
            f"s3 object {key} does not match its manifest: asked bytes {pos}-{end - 1} of "
            f"{size}, got {length} bytes of {total or 'unknown'}"
        )


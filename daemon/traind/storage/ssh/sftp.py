"""SFTP file transfer with sha256 computed on the local side, pipelined for throughput.

Uploads read and hash the local file in a worker thread while several large writes are in
flight (each split by asyncssh into parallel SFTP requests), so neither the disk, the hash
nor the round trip waits for the others. Every remote file is written under a temporary
name, fsynced and renamed into place; downloads hash what they write.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import posixpath
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import asyncssh

from traind.storage.base import Advance, counted
from traind.util.fileio import (
    StagedWriter,
    create,
    in_thread,
    iter_chunks,
    local_errors,
    unique_temporary_name,
)

if TYPE_CHECKING:
    from hashlib import _Hash as Hash


CHUNK = 1024 * 1024
"""Bytes per write/read call; asyncssh splits each into requests of the server's maximum."""

WINDOW = 4
"""Chunks in flight per file: twice OpenSSH's 2 MiB channel window, so the channel never
waits for us; more would only add memory."""


async def put_file(
    sftp: asyncssh.SFTPClient, local: Path, remote: str, part: str, advance: Advance
) -> tuple[int, str]:
    """Upload ``local`` to ``remote`` (written as ``part``, fsynced, renamed); return (bytes,
    sha256).

    Raises StorageError (not retried) when the local file cannot be read. On failure the
    progress reported through ``advance`` is taken back, so a retry does not count twice.
    """
    with counted(advance) as moved:
        return await _put_file(sftp, local, remote, part, moved)


async def _put_file(
    sftp: asyncssh.SFTPClient, local: Path, remote: str, part: str, advance: Advance
) -> tuple[int, str]:
    digest = hashlib.sha256()
    # A generator, so the file is closed on failure, not left to the GC.
    chunks = iter_chunks(local, CHUNK)
    total = 0
    async with await sftp.open(part, "wb", block_size=-1, max_requests=128) as f:
        inflight: deque[asyncio.Future[int]] = deque()
        try:
            while chunk := await asyncio.to_thread(_next_hashed, chunks, digest, local):
                if len(inflight) >= WINDOW:
                    advance(await inflight.popleft())
                inflight.append(asyncio.ensure_future(f.write(chunk, total)))
                total += len(chunk)
            while inflight:
                advance(await inflight.popleft())
        finally:
            await _cancel(inflight)
            chunks.close()
        await _fsync(f)
    await rename(sftp, part, remote)
    return total, digest.hexdigest()


async def get_file(
    sftp: asyncssh.SFTPClient, remote: str, local: Path, most: int, advance: Advance
) -> tuple[int, str]:
    """Download ``remote`` into ``local`` (not fsynced: the restore does that for the whole
    tree), no more than ``most`` bytes of it; return (bytes, sha256).

    Like ``put_file``, progress is taken back on failure.
    """
    with counted(advance) as moved:
        return await _get_file(sftp, remote, local, most, moved)


async def _get_file(
    sftp: asyncssh.SFTPClient, remote: str, local: Path, most: int, advance: Advance
) -> tuple[int, str]:
    digest = hashlib.sha256()
    total = 0
    async with await sftp.open(remote, "rb", block_size=-1, max_requests=128) as f:
        size = min((await f.stat()).size or 0, most)
        # Written in worker threads; closed by the last one still writing (StagedWriter).
        out = await in_thread("write", local, _open_for_write, local, size)
        inflight: deque[asyncio.Future[bytes]] = deque()
        try:
            for offset in range(0, size, CHUNK):
                inflight.append(asyncio.ensure_future(f.read(CHUNK, offset)))
                if len(inflight) >= WINDOW:
                    total += await _write_next(inflight, out, digest, local, advance)
            while inflight:
                total += await _write_next(inflight, out, digest, local, advance)
            await in_thread("write", local, out.finish, total)
        finally:
            await _cancel(inflight)
            out.close()
    return total, digest.hexdigest()


async def write_bytes(sftp: asyncssh.SFTPClient, remote: str, data: bytes) -> None:
    """Write a small file atomically: temporary name, fsync, rename. The name is this
    call's own, so two writers replacing one file at once never write into each other's."""
    part = unique_temporary_name(remote)
    f = await sftp.open(part, "wb")
    try:
        async with f:
            await f.write(data)
            await _fsync(f)
        await rename(sftp, part, remote)
    except Exception:
        with contextlib.suppress(asyncssh.Error, OSError):  # the first failure is the one raised
            await remove(sftp, part)
        raise


async def create_new(sftp: asyncssh.SFTPClient, remote: str, data: bytes) -> bool:
    """Create a small file only if ``remote`` does not exist; return whether this call did.

    Written whole under a unique name, fsynced, then hard-linked into place (OpenSSH's
    ``hardlink@openssh.com``), which fails when the name exists; a server without it gets
    an exclusive-create open (``O_CREAT|O_EXCL``) written in place.
    """
    part = unique_temporary_name(remote)
    try:
        async with await sftp.open(part, "wb") as f:
            await f.write(data)
            await _fsync(f)
        await sftp.link(part, remote)
    except asyncssh.SFTPOpUnsupported:
        return await _create_exclusive(sftp, remote, data)
    except (asyncssh.SFTPFailure, asyncssh.SFTPFileAlreadyExists):
        if await sftp.exists(remote):  # SFTP v3 reports "exists" as a plain failure
            return False
        raise
    finally:
        await remove(sftp, part)
    return True


async def _create_exclusive(sftp: asyncssh.SFTPClient, remote: str, data: bytes) -> bool:
    try:
        f = await sftp.open(remote, "xb")
    except (asyncssh.SFTPFailure, asyncssh.SFTPFileAlreadyExists):
        if await sftp.exists(remote):
            return False
        raise
    async with f:
        await f.write(data)
        await _fsync(f)
    return True


async def read_bytes(sftp: asyncssh.SFTPClient, remote: str) -> bytes | None:
    """A small remote file's content, or None if it does not exist."""
    data: bytes | None = None
    with contextlib.suppress(asyncssh.SFTPNoSuchFile):
        async with await sftp.open(remote, "rb") as f:
            data = cast(bytes, await f.read())  # opened "rb": always bytes
    return data


async def rename(sftp: asyncssh.SFTPClient, old: str, new: str) -> None:
    """Rename ``old`` over ``new`` atomically (posix-rename), or remove-then-rename."""
    try:
        await sftp.posix_rename(old, new)
    except asyncssh.SFTPOpUnsupported:
        await remove(sftp, new)
        await sftp.rename(old, new)


async def remove(sftp: asyncssh.SFTPClient, remote: str) -> None:
    """Remove a remote file; missing is fine."""
    with contextlib.suppress(asyncssh.SFTPNoSuchFile):
        await sftp.remove(remote)


async def makedirs(sftp: asyncssh.SFTPClient, dirs: set[str]) -> None:
    """Create remote directories and their parents; existing ones are fine.

    One round trip per directory that exists or whose parent does (asyncssh's ``makedirs``
    walks from the root every time, which costs a round trip per path component).
    """
    for d in sorted(dirs):  # parents before their children
        await _mkdir_p(sftp, d)


async def _mkdir_p(sftp: asyncssh.SFTPClient, path: str) -> None:
    try:
        await sftp.mkdir(path)
        return
    except asyncssh.SFTPNoSuchFile:
        parent = posixpath.dirname(path)
        if parent in {"", path}:
            raise
        await _mkdir_p(sftp, parent)
    except (asyncssh.SFTPFailure, asyncssh.SFTPFileAlreadyExists):
        # SFTP v3 reports "exists" as a plain failure: look before deciding.
        if await sftp.isdir(path):
            return
        if await sftp.exists(path):
            raise asyncssh.SFTPFailure(f"{path} exists and is not a directory") from None
        raise
    with contextlib.suppress(asyncssh.SFTPFailure, asyncssh.SFTPFileAlreadyExists):
        await sftp.mkdir(path)
    if not await sftp.isdir(path):
        raise asyncssh.SFTPFailure(f"cannot create directory {path}")


def parents(paths: list[str]) -> set[str]:
    """The remote directories that must exist to create ``paths``."""
    return {posixpath.dirname(p) for p in paths}


async def _fsync(f: asyncssh.SFTPClientFile) -> None:
    # fsync@openssh.com: durable before the rename publishes the file. Servers without the
    # extension cannot offer more than the rename.
    with contextlib.suppress(asyncssh.SFTPOpUnsupported):
        await f.fsync()


async def _write_next(
    inflight: deque[asyncio.Future[bytes]],
    out: StagedWriter,
    digest: Hash,
    local: Path,
    advance: Advance,
) -> int:
    data = await inflight.popleft()
    await in_thread("write", local, _write_hashed, out, data, digest)
    advance(len(data))
    return len(data)


async def _cancel(inflight: Iterable[asyncio.Future[Any]]) -> None:
    tasks = list(inflight)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _next_hashed(chunks: Iterator[bytes], digest: Hash, local: Path) -> bytes:
    """The next chunk of the local file, hashed (runs in a worker thread)."""
    with local_errors("read", local):
        chunk = next(chunks, b"")
    digest.update(chunk)
    return chunk


def _open_for_write(local: Path, size: int) -> StagedWriter:
    return StagedWriter(create(local, size))  # the caller closes it


def _write_hashed(out: StagedWriter, data: bytes, digest: Hash) -> None:
    digest.update(data)
    out.write(data)

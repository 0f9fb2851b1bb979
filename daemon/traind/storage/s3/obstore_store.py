"""The S3 store over obstore (``[storage] client = "obstore"``): the same primitives, keys and
guarantees as ``store.S3Store``, for a fraction of its client CPU per request.

Small objects are whole PUTs, create-only and replace-if-version ones conditional where the
store honours it (``conditional``, asked the same way). A file that fits in a part is read
and hashed into a pooled buffer and sent as one PUT; a larger one goes as a multipart upload
fed part by part, each part hashed as it is read, obstore retrying its parts itself. The
upload id is obstore's, so an interrupted multipart upload starts again from its first part
(``abort_uploads`` has nothing it can list). A restore is ranged GETs of ``RANGE_SIZE``,
written at their offsets and hashed in order.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import obstore

from traind.config import S3Storage
from traind.errors import IntegrityError, StorageError
from traind.layout.keys import check_relpath
from traind.storage.base import (
    Advance,
    Blob,
    LocalFile,
    ObjectMeta,
    UploadSession,
    counted,
)
from traind.storage.s3.buffers import (
    INLINE_READ,
    SMALL_FILES_PER_SLOT,
    BufferPool,
    new_digest,
    part_size_for,
    read_part,
    read_whole,
)
from traind.storage.s3.conditional import PRECONDITION
from traind.storage.s3.obstore_client import Calls, open_store
from traind.storage.s3.shared import S3StoreBase
from traind.util.fileio import SharedFd, create, local_errors, write_all
from traind.util.tasks import Slots, fan_out, task_group

if TYPE_CHECKING:
    from obstore import PutMode as ObstoreMode

RANGE_SIZE = 12 * 1024 * 1024
"""Bytes per ranged GET of a restore."""
SMALL_FETCH = 1024 * 1024
"""Files up to this size are restored ``concurrency * SMALL_FILES_PER_SLOT`` at once, larger
ones of one range ``concurrency`` at once."""
LARGE_FETCHES = 2
"""Files of more than one range restored at once (each with ``concurrency`` ranges in
flight), so a restore holds at most this many times ``concurrency * RANGE_SIZE`` bytes,
beside the files of one range."""
JSON = {"Content-Type": "application/json"}


class ObstoreS3Store(S3StoreBase):
    """Objects in ``s3://<bucket>/<prefix>/<run>/`` through obstore; no I/O until used."""

    def __init__(self, config: S3Storage, run: str) -> None:
        super().__init__(config, run)
        self._calls: Calls | None = None
        self._parts: Calls | None = None

    @property
    def _s3(self) -> Calls:
        if self._calls is None:
            self._calls = self._open(0)
        return self._calls

    def _open(self, retries: int) -> Calls:
        store = open_store(self._config, self._target, retries)
        return Calls(store, self._target, self._policy, self._config.read_timeout)

    async def _put_full(self, full: str, data: bytes, *, create: bool = False,
                        version: str | None = None) -> bool:
        mode: ObstoreMode = "create" if create else {"e_tag": version} if version else (
            "overwrite")
        return await self._put(full, data, mode)

    async def _put(self, full: str, data: bytes, mode: ObstoreMode,
                   attributes: dict[str, str] | None = JSON) -> bool:
        """One PUT of ``data`` at the full key ``full``; False when its condition failed."""
        s3 = self._s3
        try:
            await s3.call("put_object", full, lambda: obstore.put_async(
                s3.store, full, data, mode=mode, use_multipart=False, attributes=attributes,
            ), len(data))
        except StorageError as exc:
            if exc.code in PRECONDITION:
                return False
            raise
        return True

    async def _meta(self, full: str) -> obstore.ObjectMeta | None:
        """The object at the full key ``full`` as HEAD gives it, None when there is none."""
        s3 = self._s3
        try:
            return await s3.call("head_object", full, lambda: obstore.head_async(s3.store, full))
        except StorageError as exc:
            if exc.missing:
                return None
            raise

    async def _etag(self, full: str) -> str | None:
        meta = await self._meta(full)
        return None if meta is None else meta["e_tag"] or ""

    async def _delete_full(self, full: str) -> None:
        s3 = self._s3
        await s3.call("delete_object", full, lambda: obstore.delete_async(s3.store, full))

    async def get(self, key: str) -> Blob | None:
        s3, full = self._s3, self._key(key)

        async def read() -> tuple[bytes, str]:
            result = await obstore.get_async(s3.store, full)
            return bytes(await result.bytes_async()), result.meta["e_tag"] or ""

        try:
            data, version = await s3.call("get_object", full, read)
        except StorageError as exc:
            if exc.missing:
                return None
            raise
        return Blob(data, version)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        s3, full = self._s3, self._key(key)
        try:
            data = await s3.call("get_object", full, lambda: obstore.get_range_async(
                s3.store, full, start=start, end=end))
        except StorageError as exc:
            if exc.code == "InvalidRange":  # starts at or past the object's end
                return b""
            raise
        return bytes(data)

    async def head(self, key: str) -> ObjectMeta | None:
        meta = await self._meta(self._key(key))
        if meta is None:
            return None
        return ObjectMeta(key, meta["size"], meta["last_modified"].timestamp())

    async def list(self, prefix: str) -> list[ObjectMeta]:
        # object_store lists whole directories: a name's start is listed as its directory,
        # the names that do not start with it left out.
        s3 = self._s3
        base = self._run_prefix + prefix
        directory = base.rpartition("/")[0]

        async def listed() -> builtins.list[ObjectMeta]:
            cut = len(self._run_prefix)
            return [ObjectMeta(m["path"][cut:], m["size"], m["last_modified"].timestamp())
                    async for chunk in obstore.list(s3.store, directory, chunk_size=1000)
                    for m in chunk if m["path"].startswith(base)]

        return await s3.call("list_objects_v2", base, listed, None)

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        s3 = self._s3
        base = self._run_prefix + prefix
        found = await s3.call("list_objects_v2", base, lambda: obstore.list_with_delimiter_async(
            s3.store, base.rstrip("/")))
        return sorted(p[len(base):] for p in found["common_prefixes"])

    async def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        s3 = self._s3
        # object_store names a directory without its "/".
        ordered = [self._key(k) for k in keys] + self._directories(keys, slash=False)
        await s3.call("delete_objects", self._run_prefix,
                      lambda: obstore.delete_async(s3.store, ordered))

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        cfg = self._config
        pool = BufferPool(cfg.upload_memory or cfg.concurrency * cfg.part_size)
        sending = Slots(cfg.concurrency)
        sending_small = Slots(cfg.concurrency * SMALL_FILES_PER_SLOT)

        async def one(f: LocalFile) -> None:
            full = self._key(prefix + check_relpath(f.path))
            path = root / f.path
            if f.size <= cfg.part_size:
                sha = await sending_small.run(lambda: self._send_single(full, path, f.size,
                                                                        pool, session))
            else:
                sha = await sending.run(lambda: self._send_multipart(full, path, f.size,
                                                                     session))
            await session.file_done(f.path, sha)

        async with task_group() as tg:
            for f in files:
                tg.create_task(one(f))

    async def _send_single(self, full: str, path: Path, size: int, pool: BufferPool,
                           session: UploadSession) -> str:
        buf = await pool.acquire(size)
        try:
            view = memoryview(buf)[:size]
            digest = new_digest()
            with local_errors("read", path):
                if size <= INLINE_READ:
                    read_whole(path, view, digest, False)
                else:
                    await asyncio.to_thread(read_whole, path, view, digest, False)
            if self._bandwidth is not None:
                await self._bandwidth.take(size)
            # A copy: obstore keeps the buffer it is handed for as long as its request runs,
            # which an attempt timed out here does not end, and the pool reuses the buffer.
            await self._put(full, bytes(view), "overwrite", None)
        finally:
            pool.release(buf)
        session.advance(size)
        return str(digest.hexdigest())

    async def _send_multipart(self, full: str, path: Path, size: int,
                              session: UploadSession) -> str:
        """Send ``path`` as one multipart upload fed part by part (obstore retries parts,
        traind's policy the whole file); its sha256, computed as the parts are read."""
        if self._parts is None:
            self._parts = self._open(self._config.retries)
        s3 = self._parts
        part = part_size_for(size, self._config.part_size)
        digest = new_digest()

        async def upload() -> None:
            nonlocal digest
            digest = new_digest()
            with counted(session.advance) as tally:
                await obstore.put_async(
                    s3.store, full, self._parts_of(path, size, part, digest, tally),
                    use_multipart=True, chunk_size=part,
                    max_concurrency=self._config.concurrency)

        await s3.call("put_object", full, upload, size, retries=0)
        return str(digest.hexdigest())

    async def _parts_of(self, path: Path, size: int, part: int, digest: object,
                        advance: Advance) -> AsyncIterator[bytearray]:
        """The parts of ``path``, each read and hashed in a worker thread as it is asked for."""
        with local_errors("read", path):
            file = SharedFd(await asyncio.to_thread(os.open, path, os.O_RDONLY))
        try:
            for offset in range(0, size, part):
                length = min(part, size - offset)
                data = bytearray(length)
                with local_errors("read", path):
                    await asyncio.to_thread(read_part, file, offset, memoryview(data),
                                            digest, False)
                if self._bandwidth is not None:
                    await self._bandwidth.take(length)
                yield data  # a new buffer a part, never changed again: handed over uncopied
                advance(length)
        finally:
            file.close()

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        small = Slots(self._config.concurrency * SMALL_FILES_PER_SLOT)
        single = Slots(self._config.concurrency)
        large = Slots(LARGE_FETCHES)

        async def one(f: LocalFile, full: str) -> str:
            target = dest / check_relpath(f.path)
            slots = (small if f.size <= SMALL_FETCH else single if f.size <= RANGE_SIZE
                     else large)
            return await slots.run(lambda: self._fetch_file(full, target, f.size, advance))

        return await self._fetched(prefix, files, one)

    async def _fetch_file(self, full: str, target: Path, size: int, advance: Advance) -> str:
        """Write the object at ``full`` (``size`` bytes per the manifest) to ``target``;
        its sha256. Ranges are fetched ``concurrency`` at a time, hashed in order."""
        digest = new_digest()
        with local_errors("write", target):
            fd = (create(target, size) if size <= INLINE_READ
                  else await asyncio.to_thread(create, target, size))
        try:
            ranges = [(s, min(size, s + RANGE_SIZE)) for s in range(0, size, RANGE_SIZE)]
            window = self._config.concurrency
            for first in range(0, len(ranges), window):
                got = await fan_out(ranges[first:first + window], window,
                                    lambda r: self._fetch_range(full, fd, target, size, *r))
                for (start, end), data in zip(ranges[first:first + window], got, strict=True):
                    if end - start <= INLINE_READ:
                        digest.update(data)
                    else:
                        await asyncio.to_thread(digest.update, data)
                    advance(end - start)
        finally:
            os.close(fd)
        if not ranges:
            await self._fetch_range(full, -1, target, size, 0, 0)  # it must exist, empty
        return str(digest.hexdigest())

    async def _fetch_range(self, full: str, fd: int, target: Path, size: int, start: int,
                           end: int) -> memoryview:
        """Bytes ``start`` to ``end`` of ``full``, written at ``start`` of ``fd``; refused
        unless they are exactly those bytes of a ``size``-byte object."""
        s3 = self._s3
        if self._bandwidth is not None:
            await self._bandwidth.take(end - start)

        async def get() -> tuple[int, memoryview]:
            result = await obstore.get_async(
                s3.store, full, options={"range": (start, end)} if end > start else None)
            # obstore's own buffer, not copied: written and hashed from there.
            return result.meta["size"], memoryview(await result.bytes_async())

        total, data = await s3.call("get_object", full, get, end - start)
        if total != size or len(data) != end - start:
            raise IntegrityError(
                f"s3 object {full} does not match its manifest: asked bytes {start}-{end - 1} "
                f"of {size}, got {len(data)} bytes of {total}")
        if data:
            with local_errors("write", target):
                if len(data) <= INLINE_READ:
                    write_all(fd, data, start)
                else:
                    await asyncio.to_thread(write_all, fd, data, start)
        return data

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        # obstore aborts the multipart upload it fails; it lists none left by a crash.
        return 0

    async def probe(self) -> None:
        s3 = self._s3
        key = f"{self._run_prefix}.traind-probe-{uuid.uuid4().hex}"
        steps = [
            ("list objects", "list_objects_v2", lambda: obstore.list_with_delimiter_async(
                s3.store, self._run_prefix.rstrip("/"))),
            ("write probe object", "put_object", lambda: obstore.put_async(
                s3.store, key, b"traind probe")),
            ("delete probe object", "delete_object", lambda: obstore.delete_async(
                s3.store, key)),
        ]
        for what, op, request in steps:
            try:
                await s3.call(op, key if op != "list_objects_v2" else None, request)
            except StorageError as exc:
                raise type(exc)(f"probe failed at {what}: {exc}", code=exc.code,
                                status=exc.status, key=exc.key, op=exc.op) from exc
        await self._probed()

    async def aclose(self) -> None:
        self._calls = self._parts = None

"""Uploading one file: one PUT when it fits in a part, else a resumable multipart upload.

Every byte is read once: the part buffer is filled, hashed into the file's sha256 (in file
order, so reading is sequential per file) and, unless the store already has that part, sent
while the next part is read. Resume state — upload id, part size, and each finished part's
ETag and CRC32 — goes to the session as parts finish (one save at a time, covering every
part finished before it), so a restarted daemon asks ListParts which parts the store really
has and re-reads (to hash) but does not re-send them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from traind.errors import StorageError
from traind.storage.base import UploadSession
from traind.storage.s3.buffers import (
    INLINE_READ,
    BufferPool,
    TokenBucket,
    new_digest,
    part_size_for,
    read_part,
    read_whole,
)
from traind.storage.s3.client import Ops
from traind.util.fileio import SharedFd, hash_file, local_errors
from traind.util.tasks import task_group

log = structlog.get_logger("traind.s3")


@dataclass
class Resume:
    """The resume state of one multipart upload, stored as JSON in the journal."""

    upload_id: str
    key: str
    size: int
    mtime_ns: int
    part_size: int
    crc: bool
    parts: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    """Part number → (ETag, base64 CRC32 or None) of parts the store has."""

    def to_json(self) -> str:
        """Serialise for ``UploadSession.save_state``."""
        body = {k: v for k, v in self.__dict__.items() if k != "parts"}
        body["parts"] = [[n, etag, crc] for n, (etag, crc) in sorted(self.parts.items())]
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Resume | None:
        """Parse saved state; None when it is not ours or is malformed."""
        try:
            raw = json.loads(text)
            parts = {int(n): (str(etag), crc) for n, etag, crc in raw.pop("parts")}
            return cls(**raw, parts=parts)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def part_length(self, number: int) -> int:
        """The byte length of part ``number`` (1-based)."""
        return min(self.part_size, self.size - (number - 1) * self.part_size)

    @property
    def part_count(self) -> int:
        """How many parts the file has."""
        return -(-self.size // self.part_size)


def upload_id_of(state: str) -> str | None:
    """The multipart upload id inside a saved resume state, if it has one."""
    resume = Resume.from_json(state)
    return resume.upload_id if resume else None


def multipart_etag(parts: dict[int, tuple[str, str | None]]) -> str:
    """The ETag S3 gives a completed multipart object: md5 of the part md5s, dash, count."""
    md5s = b"".join(bytes.fromhex(etag.strip('"')) for _, (etag, _) in sorted(parts.items()))
    return f"{hashlib.md5(md5s, usedforsecurity=False).hexdigest()}-{len(parts)}"


class Uploader:
    """Uploads files of one checkpoint; parts of all files share one pool of buffers."""

    def __init__(
        self,
        ops: Ops,
        pool: BufferPool,
        bandwidth: TokenBucket | None,
        part_size: int,
        crc: bool,
    ) -> None:
        self._ops = ops
        self._pool = pool
        self._bandwidth = bandwidth
        self._part_size = part_size
        self._crc = crc

    async def file(self, key: str, path: Path, rel: str, size: int, session: UploadSession) -> str:
        """Store ``path`` at ``key``; return its sha256 once the object is durable."""
        with local_errors("read", path):
            if size <= self._part_size:
                return await self._single(key, path, size, session)
            return await self._multipart(key, path, rel, size, session)

    async def _single(self, key: str, path: Path, size: int, session: UploadSession) -> str:
        buf = await self._pool.acquire(size)
        try:
            view = memoryview(buf)[:size]
            digest = new_digest()
            if size <= INLINE_READ:
                crc = read_whole(path, view, digest, self._crc)
            else:
                crc = await asyncio.to_thread(read_whole, path, view, digest, self._crc)
            await self._put(key, view, crc)
        finally:
            self._pool.release(buf)
        session.advance(size)
        return str(digest.hexdigest())

    async def _multipart(
        self, key: str, path: Path, rel: str, size: int, session: UploadSession
    ) -> str:
        mtime = (await asyncio.to_thread(os.stat, path)).st_mtime_ns
        state, whole = await self._resume(key, rel, size, mtime, session)
        if whole:
            _, sha = await asyncio.to_thread(hash_file, path)
            return sha
        resumed = len(state.parts)
        digest = new_digest()
        saver = _Saver(session, rel, state)
        # A cancelled read goes on in its thread: the descriptor outlives it (SharedFd).
        file = SharedFd(await asyncio.to_thread(os.open, path, os.O_RDONLY))
        try:
            async with task_group() as tg:
                for number in range(1, state.part_count + 1):
                    length = state.part_length(number)
                    buf = await self._pool.acquire(length)
                    view = memoryview(buf)[:length]
                    have = number in state.parts
                    try:
                        crc = await asyncio.to_thread(
                            read_part, file, (number - 1) * state.part_size, view, digest,
                            self._crc and not have,
                        )
                    except BaseException:
                        self._pool.release(buf)
                        raise
                    if have:
                        self._pool.release(buf)
                        continue
                    tg.create_task(
                        self._part(state, number, buf, view, crc, session, saver)
                    )
        finally:
            file.close()
        await self._complete(state)
        log.debug("s3_multipart_done", key=key, parts=state.part_count, resumed_parts=resumed)
        return str(digest.hexdigest())

    async def _part(
        self,
        state: Resume,
        number: int,
        buf: mmap.mmap,
        view: memoryview,
        crc: str | None,
        session: UploadSession,
        saver: _Saver,
    ) -> None:
        try:
            etag = await self._put(state.key, view, crc, (state.upload_id, number))
        finally:
            self._pool.release(buf)
        state.parts[number] = (etag, crc)
        await saver.save()
        session.advance(len(view))

    async def _put(
        self, key: str, view: memoryview, crc: str | None, part: tuple[str, int] | None = None
    ) -> str:
        """Store one object, or part ``(upload id, number)`` of one; return its ETag."""
        await self._throttle(len(view))
        op = "upload_part" if part else "put_object"
        extra: dict[str, Any] = {"ChecksumCRC32": crc} if crc else {}
        if part is not None:
            extra |= {"UploadId": part[0], "PartNumber": part[1]}
        etag = str((await self._ops.call(op, key, body=view, **extra)).get("ETag") or "")
        if not etag:
            raise StorageError(f"the S3 store answered {op} of {key} without an ETag")
        return etag

    async def _resume(
        self, key: str, rel: str, size: int, mtime: int, session: UploadSession
    ) -> tuple[Resume, bool]:
        """The upload to continue (parts confirmed by ListParts) or a new one; and whether
        the object is already complete (we died between completing and recording it)."""
        part_size = part_size_for(size, self._part_size)
        saved = await session.load_state(rel)
        old = Resume.from_json(saved) if saved else None
        if old is not None:
            same = (old.key, old.size, old.mtime_ns, old.part_size, old.crc) == (
                key, size, mtime, part_size, self._crc
            )
            listed = await self._list_parts(old) if same else None
            if listed is not None:
                old.parts = _confirmed(old, listed)
                log.info("s3_upload_resumed", key=key, upload_id=old.upload_id,
                         parts_done=len(old.parts), parts=old.part_count)
                return old, False
            if same and await self._already_complete(old):
                return old, True
            await self._abort(old.key, old.upload_id)
        extra: dict[str, Any] = {"ChecksumAlgorithm": "CRC32"} if self._crc else {}
        resp = await self._ops.call("create_multipart_upload", key, **extra)
        state = Resume(str(resp["UploadId"]), key, size, mtime, part_size, self._crc)
        await session.save_state(rel, state.to_json())
        return state, False

    async def _list_parts(self, state: Resume) -> dict[int, tuple[str, str | None, int]] | None:
        """Parts the store has for the upload (number → ETag, CRC32, size); None if gone."""
        found: dict[int, tuple[str, str | None, int]] = {}
        marker = 0
        while True:
            try:
                resp = await self._ops.call(
                    "list_parts", state.key, UploadId=state.upload_id, PartNumberMarker=marker
                )
            except StorageError as exc:
                if exc.missing:
                    return None
                raise
            for part in resp.get("Parts", []):
                found[int(part["PartNumber"])] = (
                    str(part["ETag"]), part.get("ChecksumCRC32"), int(part["Size"])
                )
            if not resp.get("IsTruncated"):
                return found
            marker = int(resp["NextPartNumberMarker"])

    async def _complete(self, state: Resume) -> None:
        parts: list[dict[str, Any]] = []
        for number, (etag, crc) in sorted(state.parts.items()):
            part: dict[str, Any] = {"PartNumber": number, "ETag": etag}
            if crc:
                part["ChecksumCRC32"] = crc
            parts.append(part)
        try:
            await self._ops.call(
                "complete_multipart_upload", state.key, UploadId=state.upload_id,
                MultipartUpload={"Parts": parts},
            )
        except StorageError as exc:
            # A retry after a lost response finds the upload already completed.
            if exc.code != "NoSuchUpload":
                raise
            if not await self._already_complete(state):
                raise

    async def _already_complete(self, state: Resume) -> bool:
        """Whether the object at ``state.key`` is this upload, completed."""
        if len(state.parts) != state.part_count:
            return False
        try:
            head = await self._ops.call("head_object", state.key)
        except StorageError as exc:
            if exc.missing:
                return False
            raise
        etag = str(head.get("ETag", "")).strip('"')
        return int(head["ContentLength"]) == state.size and etag == multipart_etag(state.parts)

    async def _abort(self, key: str, upload_id: str) -> None:
        try:
            await self._ops.call("abort_multipart_upload", key, UploadId=upload_id)
        except StorageError as exc:
            if not exc.missing:
                raise

    async def _throttle(self, nbytes: int) -> None:
        if self._bandwidth is not None:
            await self._bandwidth.take(nbytes)


class _Saver:
    """Saves one file's resume state as its parts finish, one save at a time; a save covers
    every part finished before it began, so parts finishing during a slow save (the
    journal's fsync on a busy or network disk) share the next one instead of queueing a
    save each."""

    def __init__(self, session: UploadSession, rel: str, state: Resume) -> None:
        self._session = session
        self._rel = rel
        self._state = state
        self._lock = asyncio.Lock()
        self._saved = len(state.parts)
        """How many parts the last save recorded (parts are only ever added)."""

    async def save(self) -> None:
        """Return once a save that includes every part finished so far is done."""
        mine = len(self._state.parts)
        async with self._lock:
            if self._saved >= mine:
                return  # a save that began after this part finished already covered it
            covered = len(self._state.parts)
            await self._session.save_state(self._rel, self._state.to_json())
            self._saved = covered


def _confirmed(
    state: Resume, listed: dict[int, tuple[str, str | None, int]]
) -> dict[int, tuple[str, str | None]]:
    """The parts worth keeping: on the store at full length, agreeing with what we recorded.

    A part the store has but we never recorded (we died before saving) is kept too, unless
    its checksum is needed for completion and neither side knows it.
    """
    kept: dict[int, tuple[str, str | None]] = {}
    for number, (etag, listed_crc, length) in listed.items():
        ours = state.parts.get(number)
        if length != state.part_length(number):
            continue
        if ours is not None and ours[0].strip('"') != etag.strip('"'):
            continue
        crc = listed_crc or (ours[1] if ours else None)
        if state.crc and crc is None:
            continue
        kept[number] = (etag, crc)
    return kept

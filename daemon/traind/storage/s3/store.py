"""The S3 store: AWS S3 and S3-compatible stores (MinIO, R2, SeaweedFS, Ceph RGW, ...).

A key ``<tag>/<path>`` of the run lives at ``<prefix>/<run>/<tag>/<path>`` in the bucket.
Small objects are whole ``put_object``s, create-only and replace-if-version ones with
``If-None-Match``/``If-Match`` where the store honours them (``conditional``); checkpoint
files go up as resumable multipart uploads (``upload``) and come back by concurrent ranged
GETs (``download``); errors are retried or translated in ``errors``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import structlog

from traind.config import S3Storage
from traind.errors import StorageError
from traind.layout.keys import check_relpath
from traind.storage.base import (
    Advance,
    Blob,
    LocalFile,
    ObjectMeta,
    UploadSession,
)
from traind.storage.s3.buffers import SMALL_FILES_PER_SLOT, BufferPool
from traind.storage.s3.client import Ops, open_client, put_object
from traind.storage.s3.download import RANGE_SIZE, fetch_file
from traind.storage.s3.shared import S3StoreBase
from traind.storage.s3.upload import Uploader, upload_id_of
from traind.util.tasks import Slots, task_group

log = structlog.get_logger("traind.s3")
DELETE_BATCH = 1000
"""Keys per ``delete_objects`` request: S3's most."""


class S3Store(S3StoreBase):
    """Objects in ``s3://<bucket>/<prefix>/<run>/`` through aiobotocore; no I/O until first
    used."""

    def __init__(self, config: S3Storage, run: str) -> None:
        super().__init__(config, run)
        self._stack = contextlib.AsyncExitStack()
        self._ops: Ops | None = None
        self._lock = asyncio.Lock()

    async def _client(self) -> Ops:
        async with self._lock:
            if self._ops is None:
                client = await open_client(self._config, self._stack, self._target)
                self._ops = Ops(client, self._target, self._policy, self._config.read_timeout)
            return self._ops

    async def _put_full(self, full: str, data: bytes, *, create: bool = False,
                        version: str | None = None) -> bool:
        conditions = {"IfNoneMatch": "*"} if create else {"IfMatch": version} if version else {}
        return await put_object(await self._client(), full, data, **conditions)

    async def _etag(self, full: str) -> str | None:
        ops = await self._client()
        try:
            return str((await ops.call("head_object", full)).get("ETag", ""))
        except StorageError as exc:
            if exc.missing:
                return None
            raise

    async def _delete_full(self, full: str) -> None:
        await (await self._client()).call("delete_object", full)

    async def get(self, key: str) -> Blob | None:
        ops = await self._client()
        try:
            resp = await ops.call("get_object", self._key(key))
            async with resp["Body"] as body:
                data: bytes = await body.read()
        except StorageError as exc:
            if exc.missing:
                return None
            raise
        return Blob(data, str(resp.get("ETag", "")))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        ops = await self._client()
        try:
            resp = await ops.call("get_object", self._key(key), Range=f"bytes={start}-{end - 1}")
        except StorageError as exc:
            if exc.code == "InvalidRange":  # starts at or past the object's end
                return b""
            raise
        async with resp["Body"] as body:
            data: bytes = await body.read()
        return data

    async def head(self, key: str) -> ObjectMeta | None:
        ops = await self._client()
        try:
            resp = await ops.call("head_object", self._key(key))
        except StorageError as exc:
            if exc.missing:
                return None
            raise
        return ObjectMeta(key, int(resp.get("ContentLength", 0)), _epoch(resp))

    async def list(self, prefix: str) -> list[ObjectMeta]:
        ops = await self._client()
        cut = len(self._run_prefix)
        return [ObjectMeta(str(obj["Key"])[cut:], int(obj.get("Size", 0)), _epoch(obj))
                async for page in ops.pages(self._run_prefix + prefix)
                for obj in page.get("Contents", [])]

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        ops = await self._client()
        base = self._run_prefix + prefix
        return sorted([str(common["Prefix"])[len(base):].rstrip("/")
                       async for page in ops.pages(base, Delimiter="/")
                       for common in page.get("CommonPrefixes", [])])

    async def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        ops = await self._client()
        objects = [self._key(k) for k in keys]
        ordered = objects + self._directories(keys, slash=True)
        for start in range(0, len(ordered), DELETE_BATCH):
            await self._delete_batch(ops, ordered[start:start + DELETE_BATCH], set(objects))

    async def _delete_batch(self, ops: Ops, keys: builtins.list[str], objects: set[str]) -> None:
        resp = await ops.call("delete_objects",
                              Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
        if errors := [e for e in resp.get("Errors", []) if e.get("Key") in objects]:
            first = errors[0]
            raise StorageError(
                f"deleting {len(errors)} objects of s3://{self._config.bucket}/"
                f"{self._run_prefix} failed, first {first.get('Key')}: {first.get('Code')} "
                f"{first.get('Message')}"
            )

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        ops = await self._client()
        cfg = self._config
        uploader = Uploader(
            ops, BufferPool(cfg.upload_memory or cfg.concurrency * cfg.part_size),
            self._bandwidth, cfg.part_size,
            crc=cfg.request_checksum_calculation == "when_supported",
        )

        # Bounds files being sent (each multipart one holds an open upload; small files,
        # one request each, more at once); bytes are bounded by the buffer pool, shared by
        # all files. A sent file's journal record is awaited outside its slot: the next
        # file is sent while records share one transaction.
        sending = Slots(cfg.concurrency)
        sending_small = Slots(cfg.concurrency * SMALL_FILES_PER_SLOT)

        async def one(f: LocalFile) -> None:
            slots = sending_small if f.size <= cfg.part_size else sending
            key = self._key(prefix + check_relpath(f.path))
            sha = await slots.run(functools.partial(
                uploader.file, key, root / f.path, f.path, f.size, session))
            await session.file_done(f.path, sha)

        async with task_group() as tg:
            for f in files:
                tg.create_task(one(f))

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        ops = await self._client()
        # ``concurrency`` GETs in flight, each into its own buffer. A range received ahead
        # of a slower one keeps its buffer until it is hashed; spare buffers for such ranges
        # gained nothing measurable (one spare, or twice the buffers).
        pool = BufferPool(self._config.concurrency * RANGE_SIZE)

        async def one(f: LocalFile, key: str) -> str:
            return await fetch_file(ops, key, dest / check_relpath(f.path), f.size, pool,
                                    RANGE_SIZE, advance, self._bandwidth)

        return await self._fetched(prefix, files, one)

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        keep_ids = {uid for state in keep if (uid := upload_id_of(state))}
        ops = await self._client()
        base = self._run_prefix + prefix
        aborted = 0
        markers: dict[str, Any] = {}
        while True:
            page = await ops.call("list_multipart_uploads", Prefix=base, **markers)
            for upload in page.get("Uploads", []):
                if upload["UploadId"] in keep_ids:
                    continue
                try:
                    await ops.call("abort_multipart_upload", upload["Key"],
                                   UploadId=upload["UploadId"])
                    aborted += 1
                except StorageError as exc:
                    if not exc.missing:  # finished or aborted meanwhile
                        raise
            if not page.get("IsTruncated"):
                break
            markers = {"KeyMarker": page["NextKeyMarker"],
                       "UploadIdMarker": page["NextUploadIdMarker"]}
        log.info("s3_cleanup", prefix=base, aborted=aborted, kept=len(keep_ids))
        return aborted

    async def probe(self) -> None:
        ops = await self._client()
        key = f"{self._run_prefix}.traind-probe-{uuid.uuid4().hex}"
        steps: list[tuple[str, str, str | None, dict[str, Any]]] = [
            ("head bucket", "head_bucket", None, {}),
            ("list objects", "list_objects_v2", None, {"Prefix": self._run_prefix, "MaxKeys": 1}),
            ("write probe object", "put_object", key, {"Body": b"traind probe"}),
            ("delete probe object", "delete_object", key, {}),
        ]
        for what, op, step_key, params in steps:
            try:
                await ops.call(op, step_key, **params)
            except StorageError as exc:
                if op == "head_bucket" and exc.code in {"400", "403"}:
                    exc = await self._diagnose(ops) or exc
                raise type(exc)(f"probe failed at {what}: {exc}", code=exc.code,
                                status=exc.status, key=exc.key, op=exc.op) from exc
        await self._probed()

    async def _diagnose(self, ops: Ops) -> StorageError | None:
        """HEAD errors have no body; a GET on the bucket says which credential is wrong."""
        try:
            await ops.call("list_objects_v2", Prefix=self._run_prefix, MaxKeys=1)
        except StorageError as exc:
            return exc
        return None

    async def aclose(self) -> None:
        async with self._lock:
            self._ops = None
            await self._stack.aclose()


def _epoch(listed: dict[str, Any]) -> float | None:
    """The ``LastModified`` of a listed or HEAD object in seconds since the epoch."""
    when = listed.get("LastModified")
    return float(when.timestamp()) if when is not None else None

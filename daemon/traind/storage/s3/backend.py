"""The S3 backend: AWS S3 and S3-compatible stores (MinIO, R2, SeaweedFS, Ceph RGW, ...).

Objects live at ``<prefix>/<run>/<tag>/<path>``, the manifest at
``<prefix>/<run>/<tag>/traind-manifest.json``, written last by ``commit``. Large files go
up as resumable multipart uploads (``upload``), restores use concurrent ranged GETs
(``download``); errors are retried or translated in ``errors``.

At start-up the daemon calls ``cleanup`` with the journal's resume states: multipart
uploads under this run's prefix that none of them can continue are aborted rather than
billed forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import structlog

from traind.config import S3Storage
from traind.errors import ClaimHeldError, ConflictError, IntegrityError, StorageError
from traind.layout.keys import (
    AGREEMENT_DIR,
    CLAIM_NAME,
    MANIFEST_NAME,
    check_relpath,
    check_tag,
)
from traind.layout.manifest import Manifest, Writer, listed
from traind.layout.parts import Part
from traind.storage.base import Advance, LocalFile, UploadSession
from traind.storage.claim import Lease, check_committed
from traind.storage.s3 import agreement as s3_agreement
from traind.storage.s3 import claim as s3_claim
from traind.storage.s3 import parts as s3_parts
from traind.storage.s3.buffers import BufferPool, TokenBucket
from traind.storage.s3.client import SMALL_FILES_PER_SLOT, Ops, open_client, target_of
from traind.storage.s3.download import RANGE_SIZE, fetch_file
from traind.storage.s3.errors import RetryPolicy
from traind.storage.s3.upload import Uploader, upload_id_of
from traind.storage.tasks import Slots, fan_out, task_group

log = structlog.get_logger("traind.s3")
DELETE_BATCH = 1000


class S3Backend:
    """Checkpoints in ``s3://<bucket>/<prefix>/<run>/<tag>/``; no I/O until first used."""

    def __init__(self, config: S3Storage, run: str) -> None:
        self._config = config
        self._run_prefix = f"{config.prefix}/{run}/" if config.prefix else f"{run}/"
        self._target = target_of(config)
        self._policy = RetryPolicy(config.retries, cap=config.retry_max_delay)
        self._stack = contextlib.AsyncExitStack()
        self._ops: Ops | None = None
        self._lock = asyncio.Lock()
        self._bandwidth = TokenBucket(config.max_bandwidth) if config.max_bandwidth else None
        self._conditional: bool | None = None
        """Whether the store honours If-None-Match (found on first need)."""

    @property
    def describe(self) -> str:
        where = f"s3://{self._config.bucket}/{self._run_prefix}"
        return f"{where} at {self._config.endpoint_url}" if self._config.endpoint_url else where

    async def _client(self) -> Ops:
        async with self._lock:
            if self._ops is None:
                client = await open_client(self._config, self._stack, self._target)
                self._ops = Ops(client, self._target, self._policy, self._config.read_timeout)
            return self._ops

    def _key(self, tag: str, path: str | None = None) -> str:
        return f"{self._run_prefix}{check_tag(tag)}/{check_relpath(path) if path else ''}"

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
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
            sha = await slots.run(functools.partial(
                uploader.file, self._key(tag, f.path), root / f.path, f.path, f.size, session))
            await session.file_done(f.path, sha)

        async with task_group() as tg:
            for f in files:
                tg.create_task(one(f))

    async def _honours_conditional(self, ops: Ops) -> bool:
        if self._conditional is None:
            self._conditional = await s3_claim.honours_conditional(ops, self._run_prefix)
        return self._conditional

    def _where(self, tag: str) -> str:
        return f"s3://{self._config.bucket}/{self._key(tag)}"

    async def claim(self, tag: str, writer: Writer) -> None:
        ops = await self._client()
        conditional = await self._honours_conditional(ops)
        base = self._key(tag)
        try:
            if not await s3_claim.claim(ops, base, tag, writer, conditional, self._where(tag)):
                return
        except ClaimHeldError as exc:
            if (committed := await self._read_manifest(ops, tag)) is None:
                raise
            conflict = ConflictError(tag, exc.ours, exc.theirs, self._where(tag))
            conflict.committed = committed
            raise conflict from None
        try:  # committed by a traind from before claims: a manifest without a claim
            check_committed(tag, writer, await self._read_manifest(ops, tag), self._where(tag))
            if (holder := await s3_parts.any_part_claim(ops, base)) is not None:  # a job's
                raise ConflictError(tag, str(writer), str(holder), self._where(tag))
        except StorageError:
            await ops.call("delete_object", base + CLAIM_NAME)
            raise

    async def renew(self, tag: str, writer: Writer) -> None:
        await self._renew(tag, writer, None)

    async def release(self, tag: str, writer: Writer) -> None:
        found = await s3_claim.lease(await self._client(), self._key(tag))
        if found is not None and found[0].writer.id == writer.id:
            await self._renew(tag, writer, 0.0)

    async def _renew(self, tag: str, writer: Writer, at: float | None) -> None:
        ops = await self._client()
        await s3_claim.renew(ops, self._key(tag), tag, writer, at,
                             await self._honours_conditional(ops), self._where(tag))

    async def take_over(self, tag: str, stale: Lease, writer: Writer) -> bool:
        ops = await self._client()
        base = self._key(tag)
        return await s3_claim.take_over(
            ops, base, stale, writer, await self._honours_conditional(ops),
            lambda keys: self._delete_batch(ops, base, keys))

    async def claim_part(self, tag: str, rank: int, writer: Writer) -> None:
        ops = await self._client()
        await s3_parts.claim_part(ops, self._key(tag), tag, rank, writer,
                                  await self._honours_conditional(ops), self._where(tag))

    async def part_claim(self, tag: str, rank: int) -> Writer | None:
        return await s3_parts.part_claim(await self._client(), self._key(tag), rank)

    async def upload_part(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        todo = await s3_parts.keep_stored(await self._client(), self._key(tag), tag, root,
                                          files, session, self._where(tag))
        if todo:
            await self.upload(tag, root, todo, session)

    async def commit_part(self, part: Part) -> None:
        await s3_parts.commit_part(await self._client(), self._key(part.tag), part)

    async def part_ranks(self, tag: str) -> set[int]:
        return await s3_parts.part_ranks(await self._client(), self._key(tag))

    async def parts(self, tag: str) -> list[Part]:
        return await s3_parts.parts(await self._client(), self._key(tag),
                                    self._config.concurrency)

    async def committed(self, tag: str) -> Manifest | None:
        return await self._read_manifest(await self._client(), check_tag(tag))

    async def uncommitted(self) -> dict[str, list[Part]]:
        return await s3_agreement.uncommitted(await self._client(), self._run_prefix,
                                              MANIFEST_NAME, AGREEMENT_DIR,
                                              self._config.concurrency)

    @property
    def _agreement(self) -> str:
        return f"{self._run_prefix}{AGREEMENT_DIR}/"

    async def request_start(self, rank: int, nonce: str) -> None:
        await s3_agreement.request_start(await self._client(), self._agreement, rank, nonce)

    async def withdraw_start(self, rank: int, nonce: str) -> None:
        await s3_agreement.withdraw_start(await self._client(), self._agreement, rank, nonce)

    async def start_requests(self) -> dict[int, str]:
        return await s3_agreement.start_requests(await self._client(), self._agreement)

    async def write_board(self, data: bytes) -> None:
        await s3_agreement.write_board(await self._client(), self._agreement, data)

    async def read_board(self) -> bytes | None:
        return await s3_agreement.read_board(await self._client(), self._agreement)

    async def commit(self, manifest: Manifest) -> None:
        ops = await self._client()
        body = manifest.to_json()
        key = self._key(manifest.tag) + MANIFEST_NAME
        conditional = await self._honours_conditional(ops)
        if not conditional or not await s3_claim.put_new(ops, key, body, conditional=True):
            found = await self._read_manifest(ops, manifest.tag)
            check_committed(manifest.tag, manifest.writer, found, self._where(manifest.tag))
            await s3_claim.put_new(ops, key, body, conditional=False)

    async def manifests(self) -> list[Manifest]:
        ops = await self._client()
        found = await fan_out(await self._tags(ops), self._config.concurrency,
                              lambda tag: self._read_manifest(ops, tag))
        return [m for m in found if m is not None]

    async def _tags(self, ops: Ops) -> list[str]:
        """The names of the "directories" directly under the run's prefix, sorted."""
        tags = [str(common["Prefix"])[len(self._run_prefix):].rstrip("/")
                async for page in ops.pages(self._run_prefix, Delimiter="/")
                for common in page.get("CommonPrefixes", [])]
        return sorted(t for t in tags if t != AGREEMENT_DIR)  # the resume agreement's

    async def _read_manifest(self, ops: Ops, tag: str) -> Manifest | None:
        try:
            key = self._key(tag) + MANIFEST_NAME
        except ValueError:
            return None  # not a directory of ours
        try:
            resp = await ops.call("get_object", key)
            async with resp["Body"] as body:
                data = await body.read()
        except StorageError as exc:
            if exc.missing:
                return None  # an interrupted upload: not a checkpoint
            raise
        return listed(data, f"s3://{self._config.bucket}/{key}")

    async def download(self, manifest: Manifest, dest: Path, advance: Advance) -> dict[str, str]:
        ops = await self._client()
        hashes: dict[str, str] = {}
        # ``concurrency`` GETs in flight, each into its own buffer. A range received ahead
        # of a slower one keeps its buffer until it is hashed; spare buffers for such ranges
        # gained nothing measurable (one spare, or twice the buffers).
        pool = BufferPool(self._config.concurrency * RANGE_SIZE)

        async def one(path: str, size: int) -> None:
            key = self._key(manifest.tag, path)
            try:
                hashes[path] = await fetch_file(
                    ops, key, dest / check_relpath(path), size, pool, RANGE_SIZE, advance,
                    self._bandwidth,
                )
            except StorageError as exc:
                if not exc.missing:
                    raise
                raise IntegrityError(
                    f"s3://{self._config.bucket}/{key}: missing from the store ({exc.code})"
                ) from exc

        async with task_group() as tg:
            for entry in manifest.files:
                tg.create_task(one(entry.path, entry.size))
        return hashes

    async def delete(self, tag: str) -> None:
        ops = await self._client()
        prefix = self._key(tag)
        claim = prefix + CLAIM_NAME
        await ops.call("delete_object", prefix + MANIFEST_NAME)
        deleted = 0
        claims: set[str] = set()
        while True:
            # Listing from the start each round: deleted keys drop out of the listing. The
            # claims are kept to the end, so no other writer takes the tag meanwhile.
            page = await ops.call("list_objects_v2", Prefix=prefix, MaxKeys=DELETE_BATCH)
            listed_keys = {str(obj["Key"]) for obj in page.get("Contents", [])}
            mine = {k for k in listed_keys
                    if k == claim or k.startswith(prefix + s3_claim.CLAIMS_DIR)}
            claims |= mine
            keys = sorted(listed_keys - mine)
            if not keys:
                break
            await self._delete_batch(ops, prefix, keys)
            deleted += len(keys)
        if others := sorted(claims - {claim}):
            await self._delete_batch(ops, prefix, others)
        await ops.call("delete_object", claim)
        log.info("s3_deleted", tag=tag, objects=deleted)

    async def _delete_batch(self, ops: Ops, prefix: str, keys: list[str]) -> None:
        resp = await ops.call("delete_objects",
                              Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
        if errors := resp.get("Errors"):
            first = errors[0]
            raise StorageError(
                f"deleting {len(errors)} objects of s3://{self._config.bucket}/{prefix} "
                f"failed, first {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
            )

    async def probe(self) -> str:
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
        self._conditional = await s3_claim.honours_conditional(ops, self._run_prefix)
        claim = s3_claim.CONDITIONAL if self._conditional else s3_claim.LISTED
        log.info("s3_probe_ok", bucket=self._config.bucket, prefix=self._run_prefix, claim=claim)
        return claim

    async def _diagnose(self, ops: Ops) -> StorageError | None:
        """HEAD errors have no body; a GET on the bucket says which credential is wrong."""
        try:
            await ops.call("list_objects_v2", Prefix=self._run_prefix, MaxKeys=1)
        except StorageError as exc:
            return exc
        return None

    async def cleanup(self, resume_states: Collection[str]) -> int:
        """Abort multipart uploads under this run's prefix that no saved resume state can
        continue; return how many."""
        keep_upload_ids = {uid for state in resume_states if (uid := upload_id_of(state))}
        ops = await self._client()
        aborted = 0
        markers: dict[str, Any] = {}
        while True:
            page = await ops.call("list_multipart_uploads", Prefix=self._run_prefix, **markers)
            for upload in page.get("Uploads", []):
                if upload["UploadId"] in keep_upload_ids:
                    continue
                try:
                    await ops.call("abort_multipart_upload", upload["Key"],
                                   UploadId=upload["UploadId"])
                    aborted += 1
                except StorageError as exc:
                    if exc.code != "NoSuchUpload":
                        raise
            if not page.get("IsTruncated"):
                break
            markers = {"KeyMarker": page["NextKeyMarker"],
                       "UploadIdMarker": page["NextUploadIdMarker"]}
        log.info("s3_cleanup", prefix=self._run_prefix, aborted=aborted,
                 kept=len(keep_upload_ids))
        return aborted

    async def aclose(self) -> None:
        async with self._lock:
            self._ops = None
            await self._stack.aclose()

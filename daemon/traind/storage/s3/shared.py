"""What both S3 stores do alike above their client: where a run's keys live, the claim
capabilities found once, ``put`` in each mode, which directory keys a delete removes, and
a restore's files fetched at once.
Each store supplies the few requests these are made of (``S3StoreBase``'s abstract methods)."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from traind.config import S3Storage
from traind.errors import IntegrityError, StorageError
from traind.layout.keys import check_key
from traind.storage.base import OVERWRITE, Capabilities, LocalFile, PutMode
from traind.storage.s3.buffers import TokenBucket
from traind.storage.s3.conditional import CONDITIONAL, LISTED, honours_conditional
from traind.storage.s3.target import RetryPolicy, target_of
from traind.util.tasks import task_group

log = structlog.get_logger("traind.s3")


class S3StoreBase(abc.ABC):
    """Objects in ``s3://<bucket>/<prefix>/<run>/``, through the client a subclass sends
    its requests with; no I/O until first used."""

    def __init__(self, config: S3Storage, run: str) -> None:
        self._config = config
        self._run_prefix = f"{config.prefix}/{run}/" if config.prefix else f"{run}/"
        self._target = target_of(config)
        self._policy = RetryPolicy(config.retries, cap=config.retry_max_delay)
        self._bandwidth = TokenBucket(config.max_bandwidth) if config.max_bandwidth else None
        self._caps: Capabilities | None = None
        self._caps_lock = asyncio.Lock()

    @property
    def describe(self) -> str:
        where = f"s3://{self._config.bucket}/{self._run_prefix}"
        return f"{where} at {self._target.endpoint}" if self._config.endpoint_url else where

    def where(self, key: str) -> str:
        return f"s3://{self._config.bucket}/{self._run_prefix}{key}"

    def _key(self, key: str) -> str:
        return self._run_prefix + check_key(key)

    @abc.abstractmethod
    async def _put_full(self, full: str, data: bytes, *, create: bool = False,
                        version: str | None = None) -> bool:
        """Put ``data`` at the full key ``full`` whole, create-only or only while the object
        has ETag ``version`` when asked; False when the store refused it for that."""

    @abc.abstractmethod
    async def _etag(self, full: str) -> str | None:
        """The ETag of the object at the full key ``full``, None when there is none."""

    @abc.abstractmethod
    async def _delete_full(self, full: str) -> None:
        """Delete the object at the full key ``full`` (none there is no error)."""

    async def capabilities(self) -> Capabilities:
        async with self._caps_lock:
            if self._caps is None:
                self._caps = await self._detect()
            return self._caps

    async def _probed(self) -> None:
        """After a probe's requests passed: find the capabilities again, and say so."""
        async with self._caps_lock:
            self._caps = caps = await self._detect()
        log.info("s3_probe_ok", bucket=self._config.bucket, prefix=self._run_prefix,
                 claim=caps.claim)

    async def _detect(self) -> Capabilities:
        """Ask the store whether it honours conditional writes (``conditional``)."""
        async def create(full: str, data: bytes) -> bool:
            return await self._put_full(full, data, create=True)

        c = await honours_conditional(create, self._delete_full, self._run_prefix)
        return Capabilities(create=c, update=c, claim=CONDITIONAL if c else LISTED)

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        full = self._key(key)
        if mode.kind == "overwrite":
            return await self._put_full(full, data)
        caps = await self.capabilities()
        if mode.kind == "create":
            if caps.create:
                return await self._put_full(full, data, create=True)
            if await self._etag(full) is not None:
                return False
            return await self._put_full(full, data)
        assert mode.version is not None
        if caps.update:
            try:
                return await self._put_full(full, data, version=mode.version)
            except StorageError as exc:
                if exc.missing:
                    return False
                raise
        if await self._etag(full) != mode.version:
            return False
        return await self._put_full(full, data)

    def _directories(self, keys: Sequence[str], slash: bool) -> list[str]:
        """The full keys of the directories of ``keys``, deepest first, ending in "/" when
        ``slash``. A store on a filer (SeaweedFS) lists a directory after its last object
        went, so a delete removes these too, after the objects; S3 has no such keys
        (deleting none is no error), and such a store keeps a directory still holding any."""
        cut = 1 if slash else 0
        return sorted({self._run_prefix + k[:i + cut] for k in keys for i, c in enumerate(k)
                       if c == "/"}, key=lambda d: (-d.count("/"), d))

    async def _fetched(self, prefix: str, files: Sequence[LocalFile],
                       one: Callable[[LocalFile, str], Awaitable[str]]) -> dict[str, str]:
        """``one(file, its full key)`` for every one of ``files`` at once (``one`` bounds
        itself), each returning the sha256 written; path → sha256. A file missing from the
        store is an IntegrityError: the checkpoint does not match its manifest."""
        hashes: dict[str, str] = {}

        async def each(f: LocalFile) -> None:
            full = self._key(prefix + f.path)
            try:
                hashes[f.path] = await one(f, full)
            except StorageError as exc:
                if not exc.missing:
                    raise
                raise IntegrityError(
                    f"s3://{self._config.bucket}/{full}: missing from the store ({exc.code})"
                ) from exc

        async with task_group() as tg:
            for f in files:
                tg.create_task(each(f))
        return hashes

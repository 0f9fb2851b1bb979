"""The streamer's claims: take a tag before its first byte goes out, keep the lease while
it uploads, wait on another writer's, take over a stale one, release at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog

from traind.errors import StorageError, TransientStorageError
from traind.layout.manifest import Writer
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ClaimHeldError, Lease
from traind.util.retry import Backoff
from traind.util.tasks import task_group

log = structlog.get_logger("traind.streamer")
CLAIM_CHECK_EVERY = 1.0
"""Seconds between checks, as files finish, that this writer still holds the tag."""


class ClaimKeeper:
    """Claims of one writer in the store ``store()`` returns (it may be swapped), leases of
    ``claim_ttl``."""

    def __init__(self, store: Callable[[], CheckpointStore], claim_ttl: float) -> None:
        self._store = store
        self.claim_ttl = claim_ttl
        """After how long without renewal another writer's uncommitted claim is stale."""
        self.held: dict[str, Lease] = {}
        """Tags waiting on another writer's claim (its upload uncommitted), with the claim."""
        self._renewing = asyncio.Lock()

    async def claim(self, tag: str, ours: Writer) -> bool:
        """Claim ``tag``; another writer's uncommitted claim is waited on (ClaimHeldError,
        logged once) until it goes stale, then taken over: return whether it was (the
        store holds nothing of the tag then)."""
        store = self._store()
        taken = False
        try:
            await store.claim(tag, ours)
        except ClaimHeldError as exc:
            lease = exc.lease
            if not lease.stale(self.claim_ttl):
                if (before := self.held.get(tag)) is None or before.nonce != lease.nonce:
                    log.warning(
                        "checkpoint_claim_held", tag=tag, holder=str(lease.writer),
                        age=round(lease.age(), 1), stale_in=round(self.claim_ttl - lease.age(), 1),
                        backend=store.describe,
                        hint="another traind of this run is uploading this checkpoint; it is "
                             "stored once that one commits, or taken over if it stops "
                             "renewing its claim for storage.claim_ttl",
                    )
                self.held[tag] = lease
                raise
            if not await store.take_over(tag, lease, ours):
                raise TransientStorageError(
                    f"{tag}: another writer is taking over the stale claim; retrying") from exc
            log.error(
                "checkpoint_claim_taken_over", tag=tag, holder=str(lease.writer),
                age=round(lease.age(), 1), backend=store.describe,
                reason="its writer stopped renewing the claim without committing (it died "
                       "mid-upload, or released it at shutdown); its objects were removed",
            )
            taken = True
            await store.claim(tag, ours)
        self.held.pop(tag, None)
        return taken

    def wait(self, lease: Lease, retry: Backoff, attempt: int) -> float:
        """Seconds until a tag ``lease`` holds is tried again: soon enough to see the other
        writer commit, and no later than its claim goes stale."""
        stale_in = max(0.0, self.claim_ttl - lease.age())
        return min(retry.delay(attempt), stale_in + retry.initial)

    @contextlib.asynccontextmanager
    async def leased(self, tag: str, ours: Writer) -> AsyncIterator[None]:
        """Renew the claim on ``tag`` every ``claim_ttl``/4 while the body runs; losing it
        (ConflictError: taken over) cancels the body and is raised."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.claim_ttl / 4)
                await self.renew(tag, ours)

        async with task_group() as tg:
            renewing = tg.create_task(renew(), name=f"renew-{tag}")
            try:
                yield
            finally:
                renewing.cancel()

    async def renew(self, tag: str, ours: Writer) -> None:
        """Renew ``ours`` claim on ``tag``, one renewal at a time: two at once would race
        each other's compare-and-swap of the claim (and its write on a local store)."""
        async with self._renewing:
            await self._store().renew(tag, ours)

    def still_ours(self, tag: str, ours: Writer) -> Callable[[], Awaitable[None]]:
        """The check between files that the claim on ``tag`` is still ``ours`` (a renewal,
        at most one every CLAIM_CHECK_EVERY seconds however many files finish, and never two
        at once: a slow store would have them race each other's compare-and-swap)."""
        last = time.monotonic()
        renewing = False

        async def check() -> None:
            nonlocal last, renewing
            if not renewing and time.monotonic() - last >= CLAIM_CHECK_EVERY:
                renewing = True
                try:
                    await self.renew(tag, ours)  # ConflictError: lost, stop sending
                finally:
                    renewing, last = False, time.monotonic()

        return check

    async def release(self, tags: list[str], ours: Writer) -> None:
        """Mark ``ours`` claims on ``tags`` stale (a shutdown leaving them unstored), so the
        next host takes them over at once; best effort, a failure is logged."""
        store = self._store()
        for tag in tags:
            try:
                await store.release(tag, ours)
            except StorageError as exc:
                log.warning("checkpoint_claim_release_failed", tag=tag, error=str(exc))
                continue
            log.info("checkpoint_claim_released", tag=tag, backend=store.describe)

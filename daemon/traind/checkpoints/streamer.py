"""The streamer: snapshot complete checkpoints into staging, upload them, commit manifests.

``stage`` and ``complete`` are the watcher's callbacks; ``run`` drains the queue of complete
checkpoints. Upload failures never drop a checkpoint: it is retried later with backoff, and
the journal keeps every finished file, so nothing is sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.checkpoints import snapshot, writer
from traind.checkpoints.coalesce import superseded_by
from traind.checkpoints.identity import ack_dir, staging_dir
from traind.checkpoints.journal import Journal, JournalSession, StoredFile
from traind.checkpoints.restore import identity
from traind.checkpoints.watcher import StageResult, parse_step
from traind.errors import MissingFilesError, StorageError, TraindError, TransientStorageError
from traind.layout.manifest import FileEntry, Manifest, Writer, read_trainer_facts
from traind.layout.parts import Incomplete, Part, PartsDisagreeError, union
from traind.protocol import CheckpointStore
from traind.protocol.lease import ClaimHeldError, ConflictError, Lease
from traind.storage import LocalFile
from traind.util.fileio import hash_file
from traind.util.nodes import NodeRank
from traind.util.progress import Progress, shown
from traind.util.retry import Backoff
from traind.util.tasks import task_group

log = structlog.get_logger("traind.streamer")
PARTS_BACKOFF = Backoff(0.5, 10.0)
"""How often a part stored while other hosts' parts are missing looks at them again."""
RETRY_JITTER = 0.5
"""A failed upload is tried again after a pause drawn from the upper half of its backoff:
two writers that failed together (a contended claim) do not try again together."""
DROP_WAIT = 0.05
"""Seconds a drop waits for the cancelled upload of the checkpoint in flight: the store's
own cleanup (retried against a store that is down) must not hold the room back from a
trainer about to save."""
CLAIM_CHECK_EVERY = 1.0
"""Seconds between checks, as files finish, that this writer still holds the tag."""

OnCommit = Callable[[Manifest], Awaitable[None]]
OnRewritten = Callable[[str], None]
OnStaged = Callable[[int], Awaitable[None]]


class Streamer:
    """Owns the staging area of the journal's run and the queue of checkpoints waiting to
    be committed."""

    def __init__(
        self,
        run: str,
        state_dir: Path,
        storage: CheckpointStore,
        journal: Journal,
        on_commit: OnCommit | None = None,
        retry_initial: float = 1.0,
        retry_max: float = 300.0,
        claim_ttl: float = 600.0,
        node: NodeRank | None = None,
        coalesce_every: int | None = None,
    ) -> None:
        self._run = run
        self._coalesce_every = coalesce_every
        """None: every checkpoint is committed; else, on a store that limits commits, an
        older waiting checkpoint is skipped for a newer one unless a multiple of this
        (``keep_every_steps``, 0: none pinned)."""
        self._node = node if node is not None and node.nodes > 1 else None
        """This host in a multi-node job (its checkpoints are parts), None on one node."""
        self._waits: dict[str, int] = {}
        self.waiting_parts: dict[str, WaitingParts] = {}
        """Tags whose part this host stored, while other nodes' parts are missing."""
        self._state_dir = state_dir
        self._writer: Writer | None = None
        self.staging = staging_dir(state_dir, journal.run)
        self.acks = ack_dir(state_dir, journal.run)
        self.storage = storage
        self._journal = journal
        self._on_commit = on_commit
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._failures: dict[str, int] = {}
        self.stage_errors: dict[str, str] = {}
        """Why the last attempt to snapshot a tag failed (until one succeeds)."""
        self._retry = Backoff(retry_initial, retry_max, jitter=RETRY_JITTER)
        self.current: tuple[str, Progress] | None = None
        self.on_sent: Callable[[int], None] | None = None
        """Told the bytes of every chunk an upload reports sent (from worker threads too)."""
        self.on_rewritten: OnRewritten | None = None
        """Told the tag of a checkpoint written again after it was complete (the watcher
        looks at it anew)."""
        self.on_staged: OnStaged | None = None
        """Told the size of each snapshot just taken, before the trainer hears of it (the
        free-space check: the trainer's next save must fit)."""
        self.in_flight: str | None = None
        """The tag the upload loop is committing now."""
        self._committing: asyncio.Task[Manifest] | None = None
        """The commit of ``in_flight``, while it runs."""
        self._pending: set[str] = set()
        """Tags to commit: queued, in flight, or waiting to be retried (a dropped one is
        no longer pending; its queue entries are skipped)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._commit_lock = asyncio.Lock()
        self._newest_first = False
        self._newest_only = False
        """The disk is full: only the newest pending checkpoint is committed (the others
        wait in ``_parked``, and are let go once it is committed while the disk is full)."""
        self._parked: set[str] = set()
        self.claim_ttl = claim_ttl
        """After how long without renewal another writer's uncommitted claim is stale."""
        self._renewing = asyncio.Lock()
        self.held: dict[str, Lease] = {}
        """Tags waiting on another writer's claim (its upload uncommitted), with the claim."""

    @property
    def queued(self) -> int:
        """How many checkpoints wait for upload."""
        return self._queue.qsize()

    # -- watcher callbacks ----------------------------------------------------------------

    async def stage(self, tag: str, step: int, source: Path, whole: bool = False) -> StageResult:
        """Snapshot ``source`` into staging and journal it; with ``whole`` (a push by hand),
        a file that would be left out fails it rather than being reported."""
        started = time.monotonic()
        try:
            await asyncio.to_thread(self.staging.mkdir, parents=True, exist_ok=True)
            snap = await asyncio.to_thread(snapshot.take, source, self.staging / tag, whole,
                                           self._node is not None)
        except snapshot.SourceVanishedError as exc:
            log.warning("checkpoint_vanished", tag=tag, step=step, error=str(exc))
            self.stage_errors[tag] = str(exc)
            return StageResult.GONE
        except TraindError as exc:
            log.error("checkpoint_unusable", tag=tag, step=step, error=str(exc))
            self.stage_errors[tag] = str(exc)
            return StageResult.GONE
        except OSError as exc:  # disk full, permissions: the next scan tries again
            if self.stage_errors.get(tag) != str(exc):
                log.error("checkpoint_snapshot_failed", tag=tag, step=step, error=str(exc),
                          hint="retrying on every scan; free space in state_dir")
            self.stage_errors[tag] = str(exc)
            return StageResult.RETRY
        self.stage_errors.pop(tag, None)
        await self._journal.staged(tag, step, source, snap.files)
        if self.on_staged is not None:
            await self.on_staged(snap.total_bytes)
        try:
            await asyncio.to_thread(_ack, self.acks, tag)
        except OSError as exc:  # the trainer's callback waits its ack_timeout, then saves on
            log.error("checkpoint_ack_failed", tag=tag, step=step, error=str(exc),
                      hint="the trainer waits for its snapshot ack until it times out")
        log.info(
            "checkpoint_staged", tag=tag, step=step, files=len(snap.files),
            bytes=snap.total_bytes, copied=snap.copied,
            seconds=round(time.monotonic() - started, 4),
            since_last_write=round(time.time() - snap.newest_mtime, 4),
        )
        if snap.copied:
            log.warning("hardlink_impossible_copied", tag=tag, files=snap.copied)
        if snap.skipped:
            log.warning("files_skipped", tag=tag, paths=list(snap.skipped),
                        reason="only regular files, and symlinks to them inside the "
                               "checkpoint, are stored")
        return StageResult.STAGED

    async def complete(self, tag: str, step: int) -> None:
        """The snapshot of ``tag`` is final: queue it for upload (unless it was let go
        meanwhile: a snapshot dropped before the trainer rotated its source)."""
        entry = await self._journal.get(tag)
        if entry is not None and entry.state == "dropped":
            return
        await self._journal.set_state(tag, "ready")
        log.info("checkpoint_complete", tag=tag, step=step)
        self.enqueue(tag)

    def enqueue(self, tag: str) -> None:
        """Queue a ready checkpoint (also one found ready after a restart)."""
        self._pending.add(tag)
        self._idle.clear()
        self._queue.put_nowait(tag)

    # -- upload loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Commit queued checkpoints one at a time, until cancelled. A checkpoint to try
        again later is queued again by a task of this loop's own (cancelled with it)."""
        async with asyncio.TaskGroup() as later:
            while True:
                tag = await self._next()
                if tag not in self._pending:  # dropped while it waited
                    continue
                if await self._coalesced(tag):
                    continue
                if self._newest_only and tag != self.unstored[0]:
                    self._parked.add(tag)  # queued again if the disk has room again
                    continue
                self.in_flight = tag
                again: float | None = None
                try:
                    await self._commit_in_flight(tag)
                    self._failures.pop(tag, None)
                    self._pending.discard(tag)
                except _DroppedError:  # let go (``drop``), or set aside (``newest_only``)
                    await self._stopped(tag)
                except snapshot.RewrittenError as exc:
                    await self._rewritten(exc)
                    self._pending.discard(tag)  # the watcher has it again
                except ClaimHeldError as exc:
                    again = self._wait_for_claim(tag, exc.lease)  # still pending
                except PartsPendingError:
                    self._failures.pop(tag, None)
                    again = self._wait_for_parts(tag)  # still pending
                except PartsGoneError:
                    await self._parts_gone(tag)
                    self._pending.discard(tag)
                except PartsDisagreeError as exc:
                    await self._parts_disagree(tag, exc)
                    self._pending.discard(tag)  # never retried: the parts cannot be one whole
                except MissingFilesError as exc:
                    await self._journal.files_lost(tag, exc.paths)
                    again = self._files_missing(tag, exc)  # still pending: sent again
                except ConflictError:
                    self.held.pop(tag, None)
                    self._failures.pop(tag, None)
                    self._pending.discard(tag)  # never retried: the tag is another writer's
                except (StorageError, OSError) as exc:
                    again = self._retry_later(tag, exc)  # still pending
                finally:
                    self.current = self.in_flight = None
                    if not self._pending:
                        self._idle.set()
                if again is not None:
                    later.create_task(self._queue_after(again, tag), name=f"again-{tag}")

    async def _coalesced(self, tag: str) -> bool:
        """Skip ``tag`` when a newer checkpoint waits and ``tag`` is not pinned (a store
        that limits commits; one node only): dropped, and logged."""
        if self._coalesce_every is None or self._node is not None:
            return False
        steps = {parse_step(t): t for t in self._pending if t != tag}
        step = parse_step(tag)
        if step is None or (newer := superseded_by(
                step, [s for s in steps if s is not None], self._coalesce_every)) is None:
            return False
        await self.drop(tag)
        log.info("checkpoint_coalesced", tag=tag, step=step, newer=steps[newer],
                 reason="a newer checkpoint waits and the store limits commits")
        return True

    async def _commit_in_flight(self, tag: str) -> None:
        """``commit(tag)`` as a task of its own, which ``drop`` may cancel (raised here as
        _DroppedError); cancelling the loop cancels it too."""
        work = asyncio.create_task(self.commit(tag), name=f"commit-{tag}")
        self._committing = work
        try:
            await asyncio.wait([work])
        except asyncio.CancelledError:
            work.cancel()
            await asyncio.wait([work])
            raise
        finally:
            self._committing = None
        if work.cancelled():
            raise _DroppedError(tag)
        work.result()

    async def _stopped(self, tag: str) -> None:
        """The commit of ``tag`` was cancelled: if it got as far as the journal's commit it
        is done, else one still pending waits for the disk to have room (parked)."""
        entry = await self._journal.get(tag)
        if entry is not None and entry.state == "committed":
            self._pending.discard(tag)
        elif tag in self._pending:
            self._parked.add(tag)

    async def _queue_after(self, delay: float, tag: str) -> None:
        await asyncio.sleep(delay)
        self._queue.put_nowait(tag)

    def newest_only(self, on: bool) -> None:
        """While ``on`` (the disk is full), commit only the newest pending checkpoint: each
        other one (an older one in flight too) is held back, and queued again once ``on`` is
        off."""
        self._newest_only = on
        if on:
            self.prefer_newest()
            work = self._committing
            if (work is not None and work is not asyncio.current_task()
                    and self.in_flight != self.unstored[0]):
                work.cancel()  # an older one's upload: set aside for the newest
            return
        parked, self._parked = self._parked, set()
        for tag in sorted(parked & self._pending, key=lambda t: parse_step(t) or 0):
            self._queue.put_nowait(tag)

    def prefer_newest(self) -> None:
        """From now on take the newest queued checkpoint first: at shutdown, the one saved
        for a preemption is the one that matters."""
        self._newest_first = True

    async def _next(self) -> str:
        tag = await self._queue.get()
        if not self._newest_first:
            return tag
        waiting = [tag]
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        waiting.sort(key=lambda t: parse_step(t) or 0)
        for older in waiting[:-1]:
            self._queue.put_nowait(older)
        return waiting[-1]

    @property
    def unstored(self) -> list[str]:
        """The checkpoints not committed yet (queued, in flight, waiting for a retry),
        newest first."""
        return sorted(self._pending, key=lambda t: parse_step(t) or 0, reverse=True)

    @property
    def pending(self) -> int:
        """How many checkpoints are still to be committed (queued, in flight, or waiting
        for a retry after a failed upload)."""
        return len(self._pending)

    @property
    def parts_settled(self) -> bool:
        """Whether every checkpoint still to commit has this host's part stored and waits
        only for other hosts' (multi-node; on one node: whether nothing is to commit)."""
        return all(tag in self.waiting_parts for tag in self._pending)

    async def wait_idle(self) -> None:
        """Return once every checkpoint handed over is committed: nothing queued, in
        flight, or waiting for a retry."""
        await self._idle.wait()

    def _retry_later(self, tag: str, exc: BaseException) -> float:
        """Seconds until ``tag``, whose upload failed, is tried again (with backoff)."""
        n = self._failures[tag] = self._failures.get(tag, 0) + 1
        delay = self._retry.delay(n - 1)
        log.error("checkpoint_upload_failed", tag=tag, attempt=n, retry_in=delay, error=str(exc),
                  hint="retried with backoff; the snapshot waits in state_dir/staging until "
                       "the store takes it")
        return delay

    def _files_missing(self, tag: str, exc: MissingFilesError) -> float:
        """Seconds until the files of ``tag`` the store lacks are sent again: at once the
        first time (a daemon restarted mid-upload on a store that had only staged them, the
        Hub), with backoff if they go missing again."""
        if tag in self._failures:
            return self._retry_later(tag, exc)
        self._failures[tag] = 1
        log.warning("checkpoint_files_missing", tag=tag, files=len(exc.paths),
                    paths=exc.paths[:5], hint="sent again now; the manifest waits for them")
        return 0.0

    def _wait_for_claim(self, tag: str, lease: Lease) -> float:
        """Seconds until ``tag`` is tried again: soon enough to see the other writer commit,
        and no later than its claim goes stale."""
        n = self._failures[tag] = self._failures.get(tag, 0) + 1
        stale_in = max(0.0, self.claim_ttl - lease.age())
        return min(self._retry.delay(n - 1), stale_in + self._retry.initial)

    async def release(self, tags: list[str]) -> None:
        """Mark this writer's claims on ``tags`` stale (a shutdown leaving them unstored), so
        the next host takes them over at once; best effort, a failure is logged. A node's
        part claim (nodes > 1) is no lease: it stays, for that node's next daemon."""
        if self._node is not None:
            return
        ours = await self.writer()
        for tag in tags:
            try:
                await self.storage.release(tag, ours)
            except StorageError as exc:
                log.warning("checkpoint_claim_release_failed", tag=tag, error=str(exc))
                continue
            log.info("checkpoint_claim_released", tag=tag, backend=self.storage.describe)

    def _wait_for_parts(self, tag: str) -> float:
        """Seconds until ``tag``'s parts are looked at again: the other hosts' are still
        coming."""
        n = self._waits[tag] = self._waits.get(tag, 0) + 1
        return PARTS_BACKOFF.delay(n - 1)

    async def _parts_disagree(self, tag: str, exc: PartsDisagreeError) -> None:
        """The hosts' parts of ``tag`` cannot make one checkpoint: stop for good, loudly,
        and keep the local copy."""
        self._waits.pop(tag, None)
        self.waiting_parts.pop(tag, None)
        self._failures.pop(tag, None)
        await self._journal.set_state(tag, "conflict")
        log.error("checkpoint_parts_disagree", tag=tag, error=str(exc),
                  backend=self.storage.describe, kept=str(self.staging / tag),
                  hint="the hosts of the job saved different bytes under one path (or "
                       "different steps under one tag); this checkpoint is never committed")

    async def _parts_gone(self, tag: str) -> None:
        """Our part of ``tag`` was stored, and the checkpoint deleted from the store since:
        committed while this host waited and pruned by node 0, or given up by node 0 when
        another host's part never came (``run.part_timeout``). Claiming it again would
        leave an orphan part behind."""
        self._waits.pop(tag, None)
        self.waiting_parts.pop(tag, None)
        self._failures.pop(tag, None)
        await self._journal.set_state(tag, "pruned")
        await asyncio.to_thread(shutil.rmtree, self.staging / tag, True)
        log.info("checkpoint_pruned_while_waiting", tag=tag, backend=self.storage.describe,
                 reason="this host's part is gone from the store: the checkpoint was "
                        "committed and pruned before this host looked again, or node 0 "
                        "gave it up as abandoned (checkpoint_parts_abandoned)")

    async def drop(self, tag: str) -> None:
        """Let go of the snapshot of ``tag`` without storing it: journalled as dropped, so
        no restart uploads or resumes from it, and its staging removed. The one in flight
        has its upload cancelled first, waited for at most DROP_WAIT (its claim lapses as
        any unrenewed one does); it cannot be dropped from within its own commit."""
        work = self._committing
        if tag == self.in_flight and work is not None:
            if work is asyncio.current_task():
                raise TraindError(f"{tag} is being committed; it cannot be dropped")
            work.cancel()
            await asyncio.wait([work], timeout=DROP_WAIT)  # its cleanup may take longer
            if work.done() and not work.cancelled() and work.exception() is None:
                return  # committed just before: stored, nothing to let go
        self._pending.discard(tag)  # first, so the upload loop cannot pick it up meanwhile
        self._parked.discard(tag)
        self._failures.pop(tag, None)
        self.held.pop(tag, None)
        self.waiting_parts.pop(tag, None)
        if not self._pending:
            self._idle.set()
        # The space before the journal: on a disk with no byte left its write waits for it.
        await asyncio.to_thread(shutil.rmtree, self.staging / tag, True)
        await self._journal.set_state(tag, "dropped")

    async def _rewritten(self, exc: snapshot.RewrittenError) -> None:
        """Drop a snapshot the trainer wrote over; the checkpoint is snapshot again once it
        is complete again (the journal's ``staged`` state survives a restart too)."""
        self._failures.pop(exc.tag, None)
        log.error(
            "checkpoint_rewritten", tag=exc.tag, paths=exc.paths,
            hint="the trainer saved this checkpoint again after it was complete; it is "
                 "snapshot and stored anew once complete, if it is still in output_dir",
        )
        await self._journal.set_state(exc.tag, "staged")
        await asyncio.to_thread(shutil.rmtree, self.staging / exc.tag, True)
        if self.on_rewritten is not None:
            self.on_rewritten(exc.tag)

    async def _conflict(self, exc: ConflictError) -> None:
        """Another writer holds the tag: stop for good and keep every local copy."""
        await self._journal.set_state(exc.tag, "conflict")
        log.error(
            "checkpoint_conflict", tag=exc.tag, ours=exc.ours, theirs=exc.theirs,
            theirs_committed=exc.committed is not None, backend=self.storage.describe,
            kept=str(self.staging / exc.tag),
            hint="another traind with the same run.name writes to this store (or took "
                 "this tag over from this one); this checkpoint is not stored there and "
                 "its local copy is kept: give each run its own run.name",
        )

    async def _same(self, tag: str, manifest: Manifest) -> bool:
        """Whether the snapshot of ``tag`` is, file for file and byte for byte, what
        another writer committed (an output_dir shared with a host that stored it)."""
        staged = await self._journal.files(tag)
        if {(f.path, f.size) for f in staged} != {(f.path, f.size) for f in manifest.files}:
            return False
        want = {f.path: f.sha256 for f in manifest.files}
        root = self.staging / tag
        for f in staged:
            _, sha = await asyncio.to_thread(hash_file, root / f.path)
            if sha != want[f.path]:
                return False
        return True

    async def _already_stored(self, tag: str, manifest: Manifest) -> Manifest:
        """Another writer committed these very bytes: nothing to send, nothing in conflict."""
        await self._journal.begin_upload(tag, self.storage.describe)
        await self._journal.set_state(tag, "committed")
        await asyncio.to_thread(shutil.rmtree, self.staging / tag, True)
        log.info("checkpoint_already_stored", tag=tag, step=manifest.step,
                 writer=str(manifest.writer or manifest.host), backend=self.storage.describe)
        return manifest

    async def writer(self) -> Writer:
        """Who this daemon writes as (state_dir's ``writer-id`` and this host)."""
        if self._writer is None:
            self._writer = await asyncio.to_thread(writer.load_or_create, self._state_dir)
        return self._writer

    async def replace_storage(self, new: CheckpointStore) -> CheckpointStore:
        """Send everything from now on to ``new``; return the old backend.

        An upload in flight finishes on the old backend first (this waits for it); a
        checkpoint half-sent to the old backend starts over on the new one (the journal
        notices the backend changed), so nothing is lost and nothing is committed twice.
        """
        async with self._commit_lock:
            old, self.storage = self.storage, new
        return old

    async def commit(self, tag: str, progress: Progress | None = None) -> Manifest:
        """Claim ``tag`` in the store, upload what is not stored yet, then write its
        manifest; raise ConflictError (journalled, logged) when it is another writer's."""
        async with self._commit_lock:
            replaced = False
            while True:
                try:
                    return await self._commit(tag, progress)
                except ClaimHeldError:
                    raise  # not a conflict yet: the other writer's upload may never commit
                except ConflictError as exc:
                    theirs = exc.committed
                    if theirs is not None and await self._same(tag, theirs):
                        return await self._already_stored(tag, theirs)
                    if theirs is not None and not replaced and await self._corrupt(theirs):
                        await self._replace_corrupt(theirs)
                        replaced = True
                        continue
                    await self._conflict(exc)
                    raise

    async def _corrupt(self, manifest: Manifest) -> bool:
        """Whether this run found the stored ``manifest`` corrupt (a restore or ``traind
        verify`` recorded it): the trainer's new save of that step may take its place."""
        return (manifest.tag, identity(manifest)) in await self._journal.corrupt()

    async def _replace_corrupt(self, manifest: Manifest) -> None:
        """Delete a stored checkpoint recorded as corrupt (manifest first, its claim last),
        so the trainer's new save of the same step is committed in its place."""
        log.warning(
            "checkpoint_replacing_corrupt", tag=manifest.tag, step=manifest.step,
            writer=str(manifest.writer or manifest.host), backend=self.storage.describe,
            reason="recorded corrupt in the store; the trainer saved this step again",
        )
        await self.storage.delete(manifest.tag)

    async def _claim(self, tag: str, ours: Writer) -> bool:
        """Claim ``tag``; another writer's uncommitted claim is waited on (ClaimHeldError,
        logged once) until it goes stale, then taken over: return whether it was (the
        store holds nothing of the tag then)."""
        taken = False
        try:
            await self.storage.claim(tag, ours)
        except ClaimHeldError as exc:
            lease = exc.lease
            if not lease.stale(self.claim_ttl):
                if (before := self.held.get(tag)) is None or before.nonce != lease.nonce:
                    log.warning(
                        "checkpoint_claim_held", tag=tag, holder=str(lease.writer),
                        age=round(lease.age(), 1), stale_in=round(self.claim_ttl - lease.age(), 1),
                        backend=self.storage.describe,
                        hint="another traind of this run is uploading this checkpoint; it is "
                             "stored once that one commits, or taken over if it stops "
                             "renewing its claim for storage.claim_ttl",
                    )
                self.held[tag] = lease
                raise
            if not await self.storage.take_over(tag, lease, ours):
                raise TransientStorageError(
                    f"{tag}: another writer is taking over the stale claim; retrying") from exc
            log.error(
                "checkpoint_claim_taken_over", tag=tag, holder=str(lease.writer),
                age=round(lease.age(), 1), backend=self.storage.describe,
                reason="its writer stopped renewing the claim without committing (it died "
                       "mid-upload, or released it at shutdown); its objects were removed",
            )
            taken = True
            await self.storage.claim(tag, ours)
        self.held.pop(tag, None)
        return taken

    @contextlib.asynccontextmanager
    async def _leased(self, tag: str, ours: Writer) -> AsyncIterator[None]:
        """Renew the claim on ``tag`` every ``claim_ttl``/4 while the body runs; losing it
        (ConflictError: taken over) cancels the body and is raised."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.claim_ttl / 4)
                await self._renew(tag, ours)

        async with task_group() as tg:
            renewing = tg.create_task(renew(), name=f"renew-{tag}")
            try:
                yield
            finally:
                renewing.cancel()

    async def _commit(self, tag: str, progress: Progress | None) -> Manifest:
        entry = await self._journal.get(tag)
        if entry is None:
            raise StorageError(f"checkpoint {tag} is not in the journal")
        started = time.monotonic()
        ours = await self.writer()
        parts = self._part_store()
        if parts is not None:
            return await self._commit_part(tag, entry.step, ours, parts, progress, started)
        taken = await self._claim(tag, ours)  # before any byte: never over another's objects
        async with self._leased(tag, ours):
            manifest, progress = await self._upload(tag, entry.step, ours, progress, taken)
            await self._renew(tag, ours)  # still ours: else ConflictError, it lost
            await self.storage.commit(manifest)
        return await self._finish(tag, entry.step, manifest, progress, started)

    async def _commit_part(self, tag: str, step: int, ours: Writer, parts: CheckpointStore,
                           progress: Progress | None, started: float) -> Manifest:
        """With nodes > 1: claim this node's part of ``tag``, send it, store its part
        manifest and commit the union once every part is in (PartsPendingError until
        then). A part claim is this node's for good: never renewed nor taken over."""
        assert self._node is not None
        if (tag in self._waits  # our part is in: one small read
                and (found := await parts.committed(tag)) is not None):
            if not {(f.path, f.size) for f in await self._journal.files(tag)} <= {
                    (f.path, f.size) for f in found.files}:
                raise PartsDisagreeError(f"{tag}: committed without this host's files")
            return await self._finish(tag, step, found, Progress(0), started)
        if ((tag in self._waits or any(f.sha256 for f in await self._journal.files(tag)))
                and await parts.part_claim(tag, self._node.rank) is None):
            raise PartsGoneError(tag)  # claimed and sent before, deleted since
        await parts.claim_part(tag, self._node.rank, ours)
        manifest, progress = await self._upload(tag, step, ours, progress, False, parts)
        manifest = await self._commit_union(parts, manifest)
        return await self._finish(tag, step, manifest, progress, started)

    async def _finish(self, tag: str, step: int, manifest: Manifest, progress: Progress,
                      started: float) -> Manifest:
        """``tag`` is committed as ``manifest``: journal it, let its snapshot go, say so."""
        root = self.staging / tag
        self._waits.pop(tag, None)
        self.waiting_parts.pop(tag, None)
        await self._journal.set_state(tag, "committed")
        await asyncio.to_thread(shutil.rmtree, root, True)
        seconds = time.monotonic() - started
        log.info(
            "checkpoint_committed", tag=tag, step=step, files=len(manifest.files),
            bytes=manifest.total_bytes, sent_bytes=progress.done, seconds=round(seconds, 3),
            mb_per_s=round(progress.done / 1e6 / max(seconds, 1e-9), 1),
            backend=self.storage.describe,
        )
        if self._on_commit is not None:
            await self._on_commit(manifest)
        return manifest

    async def _renew(self, tag: str, ours: Writer) -> None:
        """Renew ``ours`` claim on ``tag``, one renewal at a time: two at once would race
        each other's compare-and-swap of the claim (and its write on a local store)."""
        async with self._renewing:
            await self.storage.renew(tag, ours)

    def _still_ours(self, tag: str, ours: Writer) -> Callable[[], Awaitable[None]]:
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
                    await self._renew(tag, ours)  # ConflictError: lost, stop sending
                finally:
                    renewing, last = False, time.monotonic()

        return check

    async def _upload(self, tag: str, step: int, ours: Writer, progress: Progress | None,
                      fresh: bool, parts: CheckpointStore | None = None,
                      ) -> tuple[Manifest, Progress]:
        """Send what of ``tag`` is not stored yet (all of it when ``fresh``), as this node's
        part when ``parts`` is given; return its manifest, files and progress."""
        root = self.staging / tag
        await self._journal.begin_upload(tag, self.storage.describe, fresh)
        stored = await self._journal.files(tag)
        await _unchanged(tag, root, stored)
        pending = [LocalFile(f.path, f.size) for f in stored if f.sha256 is None]
        shown_by_caller = progress is not None
        progress = progress or Progress(sum(f.size for f in pending))
        self.current = (tag, progress)
        if pending:
            guard = self._still_ours(tag, ours) if parts is None else None  # parts: no lease
            session = JournalSession(self._journal, tag, _fan_out(progress.advance, self.on_sent),
                                     guard)
            send = parts.upload_part if parts is not None else self.storage.upload
            upload = send(tag, root, pending, session)
            if shown_by_caller:
                await upload
            else:
                async with shown(progress, tag, bar=False, log_every=10.0):
                    await upload
        stored = await self._journal.files(tag)
        missing = [f.path for f in stored if f.sha256 is None]
        if missing:
            raise StorageError(f"{tag}: backend did not store {', '.join(missing)}")
        await _unchanged(tag, root, stored)  # nothing was written over while it was read
        manifest = Manifest(
            run=self._run,
            tag=tag,
            step=step,
            files=tuple(FileEntry(f.path, f.size, f.sha256 or "") for f in stored),
            trainer=await asyncio.to_thread(read_trainer_facts, root),
            writer=ours,
        )
        return manifest, progress

    def _part_store(self) -> CheckpointStore | None:
        """The store, when this host is one of several (its checkpoints are parts), else None."""
        return None if self._node is None else self.storage

    async def _commit_union(self, store: CheckpointStore, mine: Manifest) -> Manifest:
        """Store this host's part of ``mine.tag``, then commit the union when every part is
        in (whichever host's part lands last commits; the others' commits find the same
        files committed); raise PartsPendingError while some are missing."""
        assert self._node is not None
        ours = mine.writer or await self.writer()
        if mine.tag not in self._waits:  # a re-check leaves it: its created_at is its age
            await store.commit_part(Part(mine.run, mine.tag, mine.step, self._node.rank,
                                         self._node.nodes, ours, mine.files, mine.trainer))
        ranks = await store.part_ranks(mine.tag)
        decision: Manifest | Incomplete
        if missing := tuple(r for r in range(self._node.nodes) if r not in ranks):
            decision = Incomplete(tuple(sorted(ranks)), missing)
        else:  # ours completed the set: read them all and commit the union
            decision = union(mine.tag, await store.parts(mine.tag), self._node.nodes, ours)
        if isinstance(decision, Incomplete):
            self.waiting_parts[mine.tag] = WaitingParts(mine.step, self._node.rank,
                                                        decision.present, decision.missing)
            if mine.tag not in self._waits:  # said once; the re-checks read the manifest
                self._waits[mine.tag] = 0
                log.info("checkpoint_part_stored", tag=mine.tag, step=mine.step,
                         node_rank=self._node.rank, files=len(mine.files),
                         present=list(decision.present), missing=list(decision.missing))
            raise PartsPendingError(mine.tag, decision)
        try:
            await self.storage.commit_union(decision)
        except ConflictError as exc:  # another host's commit of the same union came first
            if exc.committed is None or exc.committed.files != decision.files:
                raise
            decision = exc.committed
        return decision


@dataclass(frozen=True)
class WaitingParts:
    """A checkpoint whose part this host stored: its step, this node's rank, and the nodes
    whose parts are in the store or missing, as last seen."""

    step: int
    node_rank: int
    present: tuple[int, ...]
    missing: tuple[int, ...]


class _DroppedError(TraindError):
    """The checkpoint in flight was let go (``Streamer.drop``) before it was committed."""


class PartsGoneError(TraindError):
    """This host's part of a checkpoint is gone from the store (committed, then pruned)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(f"{tag}: this host's part is no longer in the store")


class PartsPendingError(TraindError):
    """This host's part is stored; other hosts' parts are still missing."""

    def __init__(self, tag: str, state: Incomplete) -> None:
        self.tag = tag
        self.state = state
        super().__init__(f"{tag}: waiting for the parts of nodes "
                         f"{', '.join(map(str, state.missing))}")


async def _unchanged(tag: str, root: Path, stored: list[StoredFile]) -> None:
    """Raise RewrittenError when files of the snapshot in ``root`` changed since taken."""
    changed = await asyncio.to_thread(snapshot.rewritten, root, stored)
    if changed:
        raise snapshot.RewrittenError(tag, changed)


def _fan_out(
    advance: Callable[[int], None], also: Callable[[int], None] | None
) -> Callable[[int], None]:
    """``advance``, and ``also`` when there is one."""
    if also is None:
        return advance

    def both(nbytes: int) -> None:
        advance(nbytes)
        also(nbytes)

    return both


def _ack(acks: Path, tag: str) -> None:
    """Tell a waiting ``TraindCallback`` that ``tag`` is snapshot (see ``ACK_DIR_ENV``)."""
    acks.mkdir(parents=True, exist_ok=True)
    (acks / tag).touch()

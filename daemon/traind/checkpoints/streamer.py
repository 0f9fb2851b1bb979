"""The streamer: checkpoints from snapshot to committed, one at a time.

``stage`` and ``complete`` are the watcher's callbacks (the snapshot is ``Stager``'s);
``run`` drains the ``CommitQueue``. Each attempt claims the tag (``ClaimKeeper``, or this
node's part with ``PartCommitter`` in a multi-node job), sends what the journal has not
recorded stored, and commits; what it ended in decides what follows, as written once in
``lifecycle`` (retried with backoff, waited on, let go, or given up for good). Upload
failures never drop a checkpoint, and the journal keeps every finished file, so nothing is
sent twice.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from traind.checkpoints.commit import writer
from traind.checkpoints.commit.claims import ClaimKeeper
from traind.checkpoints.commit.coalesce import superseded_by
from traind.checkpoints.commit.lifecycle import DroppedError, Step, step_after
from traind.checkpoints.commit.other_writer import OtherWriters
from traind.checkpoints.commit.queue import CommitQueue
from traind.checkpoints.intake import snapshot
from traind.checkpoints.intake.stager import OnStaged, Stager
from traind.checkpoints.intake.watcher import StageResult, parse_step
from traind.checkpoints.multinode.parts import PartCommitter, WaitingParts
from traind.checkpoints.state.identity import ack_dir, staging_dir
from traind.checkpoints.state.journal import Journal, JournalSession, StoredFile
from traind.errors import MissingFilesError, StorageError, TraindError
from traind.layout.manifest import FileEntry, Manifest, Writer, read_trainer_facts
from traind.layout.parts import PartsDisagreeError
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ClaimHeldError, ConflictError, Lease
from traind.storage import LocalFile
from traind.util.nodes import NodeRank
from traind.util.progress import Progress, shown
from traind.util.retry import Backoff

log = structlog.get_logger("traind.streamer")
RETRY_JITTER = 0.5
"""A failed upload is tried again after a pause drawn from the upper half of its backoff:
two writers that failed together (a contended claim) do not try again together."""
DROP_WAIT = 0.05
"""Seconds a drop waits for the cancelled upload of the checkpoint in flight: the store's
own cleanup (retried against a store that is down) must not hold the room back from a
trainer about to save."""

OnCommit = Callable[[Manifest], Awaitable[None]]
OnRewritten = Callable[[str], None]


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
        on_staged: OnStaged | None = None,
    ) -> None:
        self._run = run
        self._coalesce_every = coalesce_every
        """None: every checkpoint is committed; else, on a store that limits commits, an
        older waiting checkpoint is skipped for a newer one unless a multiple of this
        (``keep_every_steps``, 0: none pinned)."""
        self._state_dir = state_dir
        self._writer: Writer | None = None
        self.staging = staging_dir(state_dir, journal.run)
        self.acks = ack_dir(state_dir, journal.run)
        self.storage = storage
        self._journal = journal
        self._on_commit = on_commit
        self._queue = CommitQueue()
        self._stager = Stager(self.staging, self.acks, journal,
                              node is not None and node.nodes > 1, on_staged)
        self._keeper = ClaimKeeper(lambda: self.storage, claim_ttl)
        self._theirs = OtherWriters(lambda: self.storage, journal, self.staging)
        self._parts = (PartCommitter(node, lambda: self.storage, journal, self.staging)
                       if node is not None and node.nodes > 1 else None)
        """This host's parts in a multi-node job; None on one node."""
        self._failures: dict[str, int] = {}
        self._retry = Backoff(retry_initial, retry_max, jitter=RETRY_JITTER)
        self.current: tuple[str, Progress] | None = None
        self.on_sent: Callable[[int], None] | None = None
        """Told the bytes of every chunk an upload reports sent (from worker threads too)."""
        self.on_rewritten: OnRewritten | None = None
        """Told the tag of a checkpoint written again after it was complete (the watcher
        looks at it anew)."""
        self.in_flight: str | None = None
        """The tag the upload loop is committing now."""
        self._committing: asyncio.Task[Manifest] | None = None
        """The commit of ``in_flight``, while it runs."""
        self._commit_lock = asyncio.Lock()
        self._newest_only = False
        """The disk is full: only the newest pending checkpoint is committed (the others
        wait parked, and are let go once it is committed while the disk is full)."""

    # -- what the daemon, the status page and the CLI read ------------------------------

    @property
    def queued(self) -> int:
        """How many checkpoints wait for upload."""
        return self._queue.queued

    @property
    def unstored(self) -> list[str]:
        """The checkpoints not committed yet (queued, in flight, waiting for a retry),
        newest first."""
        return self._queue.unstored

    @property
    def pending(self) -> int:
        """How many checkpoints are still to be committed (queued, in flight, or waiting
        for a retry after a failed upload)."""
        return len(self._queue.pending)

    @property
    def held(self) -> dict[str, Lease]:
        """Tags waiting on another writer's claim (its upload uncommitted), with the claim."""
        return self._keeper.held

    @property
    def claim_ttl(self) -> float:
        """After how long without renewal another writer's uncommitted claim is stale."""
        return self._keeper.claim_ttl

    @claim_ttl.setter
    def claim_ttl(self, seconds: float) -> None:
        self._keeper.claim_ttl = seconds

    @property
    def stage_errors(self) -> dict[str, str]:
        """Why the last attempt to snapshot a tag failed (until one succeeds)."""
        return self._stager.errors

    @property
    def waiting_parts(self) -> dict[str, WaitingParts]:
        """Tags whose part this host stored, while other nodes' parts are missing."""
        return {} if self._parts is None else self._parts.waiting

    @property
    def parts_settled(self) -> bool:
        """Whether every checkpoint still to commit has this host's part stored and waits
        only for other hosts' (multi-node; on one node: whether nothing is to commit)."""
        return all(tag in self.waiting_parts for tag in self._queue.pending)

    async def wait_idle(self) -> None:
        """Return once every checkpoint handed over is committed: nothing queued, in
        flight, or waiting for a retry."""
        await self._queue.wait_idle()

    # -- watcher callbacks ----------------------------------------------------------------

    async def stage(self, tag: str, step: int, source: Path, whole: bool = False) -> StageResult:
        """Snapshot ``source`` into staging and journal it (``Stager.stage``)."""
        return await self._stager.stage(tag, step, source, whole)

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
        self._queue.put(tag)

    # -- the upload loop ------------------------------------------------------------------

    async def run(self) -> None:
        """Commit queued checkpoints one at a time, until cancelled: each attempt's end is
        a ``lifecycle.Step``, and ``_after`` does what follows it. A checkpoint to try
        again later is queued again by a task of this loop's own (cancelled with it)."""
        async with asyncio.TaskGroup() as later:
            while True:
                tag = await self._queue.next()
                if tag not in self._queue.pending or await self._coalesced(tag):
                    continue  # dropped while it waited, or skipped for a newer one
                if self._newest_only and tag != self._queue.unstored[0]:
                    self._queue.parked.add(tag)  # queued again if the disk has room again
                    continue
                self.in_flight = tag
                failure: Exception | None = None
                try:
                    await self._commit_in_flight(tag)
                except Exception as exc:
                    failure = exc
                finally:
                    self.current = self.in_flight = None
                if (step := step_after(failure)) is None:
                    assert failure is not None
                    raise failure
                again = await self._after(step, tag, failure)
                self._queue.settle()
                if again is not None:
                    later.create_task(self._queue.again(again, tag), name=f"again-{tag}")

    async def _after(self, step: Step, tag: str, exc: Exception | None) -> float | None:
        """Do what follows ``step`` for ``tag`` (``exc``: what the attempt raised); return
        in how many seconds it is tried again, None when it is not (done, or queued again
        by someone else)."""
        match step:
            case Step.COMMITTED | Step.CONFLICT:  # a conflict was journalled and logged
                self._forget(tag)
            case Step.STOPPED:
                entry = await self._journal.get(tag)
                if entry is not None and entry.state == "committed":  # got that far
                    self._queue.done(tag)
                elif tag in self._queue.pending:
                    self._queue.parked.add(tag)  # waits for the disk to have room
            case Step.REWRITTEN:
                assert isinstance(exc, snapshot.RewrittenError)
                await self._rewritten(exc)
                self._queue.done(tag)  # the watcher has it again
            case Step.CLAIM_HELD:
                assert isinstance(exc, ClaimHeldError)
                return self._keeper.wait(exc.lease, self._retry, self._failed(tag) - 1)
            case Step.PARTS_PENDING:
                assert self._parts is not None
                self._failures.pop(tag, None)
                return self._parts.wait(tag)
            case Step.PARTS_GONE:
                assert self._parts is not None
                await self._parts.gone(tag)
                self._forget(tag)
            case Step.PARTS_DISAGREE:
                assert self._parts is not None
                assert isinstance(exc, PartsDisagreeError)
                await self._parts.disagree(tag, exc)
                self._forget(tag)  # never retried: the parts cannot be one whole
            case Step.FILES_MISSING:
                assert isinstance(exc, MissingFilesError)
                await self._journal.files_lost(tag, exc.paths)
                return self._files_missing(tag, exc)  # sent again
            case Step.FAILED:
                assert exc is not None
                return self._retry_later(tag, exc)
        return None

    def _forget(self, tag: str) -> None:
        """``tag`` is pending no more: committed, let go, or given up for good."""
        self._failures.pop(tag, None)
        self._keeper.held.pop(tag, None)
        if self._parts is not None:
            self._parts.forget(tag)
        self._queue.done(tag)

    def _failed(self, tag: str) -> int:
        """Count one more failed attempt of ``tag``; return how many there were."""
        n = self._failures[tag] = self._failures.get(tag, 0) + 1
        return n

    async def _coalesced(self, tag: str) -> bool:
        """Skip ``tag`` when a newer checkpoint waits and ``tag`` is not pinned (a store
        that limits commits; one node only): dropped, and logged."""
        if self._coalesce_every is None or self._parts is not None:
            return False
        steps = {parse_step(t): t for t in self._queue.pending if t != tag}
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
        DroppedError); cancelling the loop cancels it too."""
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
            raise DroppedError(tag)
        work.result()

    def newest_only(self, on: bool) -> None:
        """While ``on`` (the disk is full), commit only the newest pending checkpoint: each
        other one (an older one in flight too) is held back, and queued again once ``on`` is
        off."""
        self._newest_only = on
        if on:
            self.prefer_newest()
            work, unstored = self._committing, self._queue.unstored
            # An upload dropped while it still stops is no longer pending: nothing to cancel.
            if (work is not None and work is not asyncio.current_task()
                    and self.in_flight in unstored[1:]):
                work.cancel()  # an older one's upload: set aside for the newest
            return
        self._queue.unpark()

    def prefer_newest(self) -> None:
        """From now on take the newest queued checkpoint first: at shutdown, the one saved
        for a preemption is the one that matters."""
        self._queue.prefer_newest()

    def _retry_later(self, tag: str, exc: BaseException) -> float:
        """Seconds until ``tag``, whose upload failed, is tried again (with backoff)."""
        n = self._failed(tag)
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

    async def release(self, tags: list[str]) -> None:
        """Mark this writer's claims on ``tags`` stale (a shutdown leaving them unstored), so
        the next host takes them over at once; best effort, a failure is logged. A node's
        part claim (nodes > 1) is no lease: it stays, for that node's next daemon."""
        if self._parts is None:
            await self._keeper.release(tags, await self.writer())

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
        self._forget(tag)  # first, so the upload loop cannot pick it up meanwhile
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
                    if theirs is not None and await self._theirs.same(tag, theirs):
                        return await self._theirs.already_stored(tag, theirs)
                    if theirs is not None and not replaced and await self._theirs.corrupt(theirs):
                        await self._theirs.replace(theirs)
                        replaced = True
                        continue
                    await self._theirs.conflict(exc)
                    raise

    async def _commit(self, tag: str, progress: Progress | None) -> Manifest:
        """One attempt: claim ``tag`` (this node's part of it in a multi-node job), send
        what is not stored, commit (the union, once every node's part is in)."""
        entry = await self._journal.get(tag)
        if entry is None:
            raise StorageError(f"checkpoint {tag} is not in the journal")
        started = time.monotonic()
        ours = await self.writer()
        if self._parts is not None:
            if (found := await self._parts.committed_since(tag)) is not None:
                return await self._finish(tag, entry.step, found, Progress(0), started)
            await self._parts.claim(tag, ours)
            manifest, progress = await self._upload(tag, entry.step, ours, progress, False)
            manifest = await self._parts.commit(manifest, ours)
            return await self._finish(tag, entry.step, manifest, progress, started)
        taken = await self._keeper.claim(tag, ours)  # before any byte: never over another's
        async with self._keeper.leased(tag, ours):
            manifest, progress = await self._upload(tag, entry.step, ours, progress, taken)
            await self._keeper.renew(tag, ours)  # still ours: else ConflictError, it lost
            await self.storage.commit(manifest)
        return await self._finish(tag, entry.step, manifest, progress, started)

    async def _finish(self, tag: str, step: int, manifest: Manifest, progress: Progress,
                      started: float) -> Manifest:
        """``tag`` is committed as ``manifest``: journal it, let its snapshot go, say so."""
        root = self.staging / tag
        if self._parts is not None:
            self._parts.forget(tag)
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

    async def _upload(self, tag: str, step: int, ours: Writer, progress: Progress | None,
                      fresh: bool) -> tuple[Manifest, Progress]:
        """Send what of ``tag`` is not stored yet (all of it when ``fresh``), as this node's
        part in a multi-node job; return its manifest, files and progress."""
        root = self.staging / tag
        await self._journal.begin_upload(tag, self.storage.describe, fresh)
        stored = await self._journal.files(tag)
        await _unchanged(tag, root, stored)
        pending = [LocalFile(f.path, f.size) for f in stored if f.sha256 is None]
        shown_by_caller = progress is not None
        progress = progress or Progress(sum(f.size for f in pending))
        self.current = (tag, progress)
        if pending:
            parts = self._parts is not None
            guard = None if parts else self._keeper.still_ours(tag, ours)  # parts: no lease
            session = JournalSession(self._journal, tag, _fan_out(progress.advance, self.on_sent),
                                     guard)
            send = self.storage.upload_part if parts else self.storage.upload
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

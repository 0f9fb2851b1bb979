"""The streamer: checkpoints from snapshot to committed, one at a time.

``stage`` and ``complete`` are the watcher's callbacks (the snapshot is ``Stager``'s);
``run`` drains the ``CommitQueue``. Each attempt is ``Committer.commit`` (claim, send what
is not stored, commit); what it ended in decides what follows, as written once in
``lifecycle`` (retried with backoff as ``Attempts`` counts, waited on, let go, or given up
for good). Upload
failures never drop a checkpoint, and the journal keeps every finished file, so nothing is
sent twice.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from traind.checkpoints.commit.attempts import Attempts
from traind.checkpoints.commit.coalesce import newer_tag
from traind.checkpoints.commit.committer import Committer
from traind.checkpoints.commit.lifecycle import DroppedError, Step, step_after
from traind.checkpoints.commit.queue import CommitQueue
from traind.checkpoints.intake import snapshot
from traind.checkpoints.intake.stager import OnStaged, Stager
from traind.checkpoints.intake.watcher import StageResult, parse_step
from traind.checkpoints.multinode.parts import WaitingParts
from traind.checkpoints.state.identity import ack_dir, staging_dir
from traind.checkpoints.state.journal import Journal
from traind.errors import MissingFilesError, TraindError
from traind.layout.manifest import Manifest, Writer
from traind.layout.parts import PartsDisagreeError
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ClaimHeldError, Lease
from traind.util.nodes import NodeRank
from traind.util.progress import Progress

log = structlog.get_logger("traind.streamer")
DROP_WAIT = 0.05
"""Seconds a drop waits for the cancelled upload of the checkpoint in flight: the store's
own cleanup (retried against a store that is down) must not hold the room back from a
trainer about to save."""

OnCommit = Callable[[Manifest], Awaitable[None]]
OnRewritten = Callable[[str], None]


class Streamer:
    """Owns the staging area of the journal's run and the queue of checkpoints waiting to
    be committed."""

    def __init__(self, run: str, state_dir: Path, storage: CheckpointStore, journal: Journal,
                 on_commit: OnCommit | None = None, retry_initial: float = 1.0,
                 retry_max: float = 300.0, claim_ttl: float = 600.0,
                 node: NodeRank | None = None, coalesce_every: int | None = None,
                 on_staged: OnStaged | None = None) -> None:
        self._coalesce_every = coalesce_every
        """None: every checkpoint is committed; else, on a store that limits commits, an
        older waiting checkpoint is skipped for a newer one unless a multiple of this
        (``keep_every_steps``, 0: none pinned)."""
        self.staging = staging_dir(state_dir, journal.run)
        self.acks = ack_dir(state_dir, journal.run)
        self._journal = journal
        self._queue = CommitQueue()
        self._stager = Stager(self.staging, self.acks, journal,
                              node is not None and node.nodes > 1, on_staged)
        self.committer = Committer(run, state_dir, self.staging, storage, journal, on_commit,
                                   claim_ttl, node)
        self._keeper = self.committer.keeper
        self._parts = self.committer.parts
        self._attempts = Attempts(retry_initial, retry_max)
        self.on_rewritten: OnRewritten | None = None
        """Told the tag of a checkpoint written again after it was complete (the watcher
        looks at it anew)."""
        self.in_flight: str | None = None
        """The tag the upload loop is committing now."""
        self._committing: asyncio.Task[Manifest] | None = None
        """The commit of ``in_flight``, while it runs."""
        self._newest_only = False
        """The disk is full: only the newest pending checkpoint is committed (the others
        wait parked, and are let go once it is committed while the disk is full)."""

    # -- what the daemon, the status page and the CLI read ------------------------------

    @property
    def storage(self) -> CheckpointStore:
        """The store checkpoints go to now (reload may replace it)."""
        return self.committer.storage

    @property
    def current(self) -> tuple[str, Progress] | None:
        """The checkpoint being sent and its progress."""
        return self.committer.current

    @property
    def on_sent(self) -> Callable[[int], None] | None:
        """Told the bytes of every chunk an upload reports sent (from worker threads too)."""
        return self.committer.on_sent

    @on_sent.setter
    def on_sent(self, told: Callable[[int], None] | None) -> None:
        self.committer.on_sent = told

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
                    self.committer.current = self.in_flight = None
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
                self._attempts.forget(exc.tag)
                await self._stager.rewritten(exc)
                if self.on_rewritten is not None:
                    self.on_rewritten(exc.tag)
                self._queue.done(tag)  # the watcher has it again
            case Step.CLAIM_HELD:
                assert isinstance(exc, ClaimHeldError)
                return self._keeper.wait(exc.lease, self._attempts.backoff,
                                        self._attempts.failed(tag) - 1)
            case Step.PARTS_PENDING:
                assert self._parts is not None
                self._attempts.forget(tag)
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
                return self._attempts.files_missing(tag, exc)  # sent again
            case Step.FAILED:
                assert exc is not None
                return self._attempts.retry_later(tag, exc)
        return None

    def _forget(self, tag: str) -> None:
        """``tag`` is pending no more: committed, let go, or given up for good."""
        self._attempts.forget(tag)
        self._keeper.held.pop(tag, None)
        if self._parts is not None:
            self._parts.forget(tag)
        self._queue.done(tag)

    async def _coalesced(self, tag: str) -> bool:
        """Skip ``tag`` when a newer checkpoint waits and ``tag`` is not pinned (a store
        that limits commits; one node only): dropped, and logged."""
        if self._coalesce_every is None or self._parts is not None:
            return False
        newer = newer_tag(tag, self._queue.pending, self._coalesce_every)
        if newer is None:
            return False
        await self.drop(tag)
        log.info("checkpoint_coalesced", tag=tag, step=parse_step(tag), newer=newer,
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

    async def writer(self) -> Writer:
        """Who this daemon writes as (state_dir's ``writer-id`` and this host)."""
        return await self.committer.writer()

    async def replace_storage(self, new: CheckpointStore) -> CheckpointStore:
        """Send everything from now on to ``new``; return the old backend (see
        ``Committer.replace_storage``)."""
        return await self.committer.replace_storage(new)

    async def commit(self, tag: str, progress: Progress | None = None) -> Manifest:
        """Commit ``tag`` now (``Committer.commit``)."""
        return await self.committer.commit(tag, progress)

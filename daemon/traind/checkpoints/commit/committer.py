"""One checkpoint from its snapshot to committed: claim the tag (``ClaimKeeper``, or this
node's part with ``PartCommitter`` in a multi-node job), send what the journal has not
recorded stored, write the manifest. A tag another writer committed is settled here too
(``OtherWriters``: the same checkpoint, a corrupt one replaced, or a conflict)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from traind.checkpoints.commit import writer
from traind.checkpoints.commit.claims import ClaimKeeper
from traind.checkpoints.commit.other_writer import OtherWriters
from traind.checkpoints.intake import snapshot
from traind.checkpoints.multinode.parts import PartCommitter
from traind.checkpoints.state.journal import Journal, JournalSession, StoredFile
from traind.errors import StorageError
from traind.layout.manifest import FileEntry, Manifest, Writer, read_trainer_facts
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ClaimHeldError, ConflictError
from traind.storage import LocalFile
from traind.util.nodes import NodeRank
from traind.util.progress import Progress, shown

log = structlog.get_logger("traind.streamer")

OnCommit = Callable[[Manifest], Awaitable[None]]


class Committer:
    """Commits checkpoints of the journal's run from ``staging`` to the store, one at a
    time (a lock; a store swapped by reload waits for the commit in flight)."""

    def __init__(self, run: str, state_dir: Path, staging: Path, storage: CheckpointStore,
                 journal: Journal, on_commit: OnCommit | None, claim_ttl: float,
                 node: NodeRank | None) -> None:
        self._run = run
        self._state_dir = state_dir
        self._staging = staging
        self.storage = storage
        self._journal = journal
        self.on_commit = on_commit
        self._writer: Writer | None = None
        self._lock = asyncio.Lock()
        self.keeper = ClaimKeeper(lambda: self.storage, claim_ttl)
        self._theirs = OtherWriters(lambda: self.storage, journal, staging)
        self.parts = (PartCommitter(node, lambda: self.storage, journal, staging)
                      if node is not None and node.nodes > 1 else None)
        """This host's parts in a multi-node job; None on one node."""
        self.current: tuple[str, Progress] | None = None
        """The checkpoint being sent and its progress."""
        self.on_sent: Callable[[int], None] | None = None
        """Told the bytes of every chunk an upload reports sent (from worker threads too)."""

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
        async with self._lock:
            old, self.storage = self.storage, new
        return old

    async def commit(self, tag: str, progress: Progress | None = None) -> Manifest:
        """Claim ``tag`` in the store, upload what is not stored yet, then write its
        manifest; raise ConflictError (journalled, logged) when it is another writer's."""
        async with self._lock:
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
        if self.parts is not None:
            if (found := await self.parts.committed_since(tag)) is not None:
                return await self._finish(tag, entry.step, found, Progress(0), started)
            await self.parts.claim(tag, ours)
            manifest, progress = await self._upload(tag, entry.step, ours, progress, False)
            manifest = await self.parts.commit(manifest, ours)
            return await self._finish(tag, entry.step, manifest, progress, started)
        taken = await self.keeper.claim(tag, ours)  # before any byte: never over another's
        async with self.keeper.leased(tag, ours):
            manifest, progress = await self._upload(tag, entry.step, ours, progress, taken)
            await self.keeper.renew(tag, ours)  # still ours: else ConflictError, it lost
            await self.storage.commit(manifest)
        return await self._finish(tag, entry.step, manifest, progress, started)

    async def _finish(self, tag: str, step: int, manifest: Manifest, progress: Progress,
                      started: float) -> Manifest:
        """``tag`` is committed as ``manifest``: journal it, let its snapshot go, say so."""
        root = self._staging / tag
        if self.parts is not None:
            self.parts.forget(tag)
        await self._journal.set_state(tag, "committed")
        await asyncio.to_thread(shutil.rmtree, root, True)
        seconds = time.monotonic() - started
        log.info(
            "checkpoint_committed", tag=tag, step=step, files=len(manifest.files),
            bytes=manifest.total_bytes, sent_bytes=progress.done, seconds=round(seconds, 3),
            mb_per_s=round(progress.done / 1e6 / max(seconds, 1e-9), 1),
            backend=self.storage.describe,
        )
        if self.on_commit is not None:
            await self.on_commit(manifest)
        return manifest

    async def _upload(self, tag: str, step: int, ours: Writer, progress: Progress | None,
                      fresh: bool) -> tuple[Manifest, Progress]:
        """Send what of ``tag`` is not stored yet (all of it when ``fresh``), as this node's
        part in a multi-node job; return its manifest, files and progress."""
        root = self._staging / tag
        await self._journal.begin_upload(tag, self.storage.describe, fresh)
        stored = await self._journal.files(tag)
        await _unchanged(tag, root, stored)
        pending = [LocalFile(f.path, f.size) for f in stored if f.sha256 is None]
        shown_by_caller = progress is not None
        progress = progress or Progress(sum(f.size for f in pending))
        self.current = (tag, progress)
        if pending:
            parts = self.parts is not None
            guard = None if parts else self.keeper.still_ours(tag, ours)  # parts: no lease
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

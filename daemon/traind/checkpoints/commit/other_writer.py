"""A tag another writer of the run committed: the very bytes of this snapshot (nothing to
send), a copy this run found corrupt (replaced by the trainer's new save), or a conflict
(never stored here, every local copy kept)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import structlog

from traind.checkpoints.restore.download import identity
from traind.checkpoints.state.journal import Journal
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ConflictError
from traind.util.fileio import hash_file

log = structlog.get_logger("traind.streamer")


class OtherWriters:
    """What the streamer does about another writer's tag in ``store()``."""

    def __init__(self, store: Callable[[], CheckpointStore], journal: Journal,
                 staging: Path) -> None:
        self._store = store
        self._journal = journal
        self._staging = staging

    async def conflict(self, exc: ConflictError) -> None:
        """Another writer holds the tag: stop for good and keep every local copy."""
        await self._journal.set_state(exc.tag, "conflict")
        log.error(
            "checkpoint_conflict", tag=exc.tag, ours=exc.ours, theirs=exc.theirs,
            theirs_committed=exc.committed is not None, backend=self._store().describe,
            kept=str(self._staging / exc.tag),
            hint="another traind with the same run.name writes to this store (or took "
                 "this tag over from this one); this checkpoint is not stored there and "
                 "its local copy is kept: give each run its own run.name",
        )

    async def same(self, tag: str, manifest: Manifest) -> bool:
        """Whether the snapshot of ``tag`` is, file for file and byte for byte, what
        another writer committed (an output_dir shared with a host that stored it)."""
        staged = await self._journal.files(tag)
        if {(f.path, f.size) for f in staged} != {(f.path, f.size) for f in manifest.files}:
            return False
        want = {f.path: f.sha256 for f in manifest.files}
        root = self._staging / tag
        for f in staged:
            _, sha = await asyncio.to_thread(hash_file, root / f.path)
            if sha != want[f.path]:
                return False
        return True

    async def already_stored(self, tag: str, manifest: Manifest) -> Manifest:
        """Another writer committed these very bytes: nothing to send, nothing in conflict."""
        await self._journal.begin_upload(tag, self._store().describe)
        await self._journal.set_state(tag, "committed")
        await asyncio.to_thread(shutil.rmtree, self._staging / tag, True)
        log.info("checkpoint_already_stored", tag=tag, step=manifest.step,
                 writer=str(manifest.writer), backend=self._store().describe)
        return manifest

    async def corrupt(self, manifest: Manifest) -> bool:
        """Whether this run found the stored ``manifest`` corrupt (a restore or ``traind
        verify`` recorded it): the trainer's new save of that step may take its place."""
        return (manifest.tag, identity(manifest)) in await self._journal.corrupt()

    async def replace(self, manifest: Manifest) -> None:
        """Delete a stored checkpoint recorded as corrupt (manifest first, its claim last),
        so the trainer's new save of the same step is committed in its place."""
        log.warning(
            "checkpoint_replacing_corrupt", tag=manifest.tag, step=manifest.step,
            writer=str(manifest.writer), backend=self._store().describe,
            reason="recorded corrupt in the store; the trainer saved this step again",
        )
        await self._store().delete(manifest.tag)


"""``traind push``: commit one checkpoint directory by hand, through the same pipeline.

The directory is snapshot into a private staging area and committed by the streamer, so a
manual push is verified and journalled exactly like one the daemon found itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake import snapshot
from traind.checkpoints.intake.watcher import StageResult, parse_step, tag_problem
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.config import Settings
from traind.errors import ContendedError, TraindError
from traind.layout.keys import check_tag
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore, open_storage
from traind.util.progress import Progress, shown
from traind.util.retry import Backoff, retrying

PUSH_CONTENDED = Backoff(0.5, 4.0, jitter=1.0)
PUSH_ATTEMPTS = 4
"""A push whose claim collided this often (each a dozen listed attempts) gives up, saying so."""


@dataclass(frozen=True)
class PushPlan:
    """What ``push`` would send: the tag, each file's relative path and size, the store."""

    tag: str
    files: tuple[tuple[str, int], ...]
    backend: str

    @property
    def total_bytes(self) -> int:
        """The bytes the push would upload."""
        return sum(size for _, size in self.files)


async def plan(settings: Settings, source: Path, tag: str | None = None) -> PushPlan:
    """What pushing ``source`` would commit, refused as ``push`` would refuse it; reads the
    directory and the store's manifests, writes nothing (``traind push --dry-run``)."""
    tag, _ = _tag_and_step(source, tag)
    entries = await asyncio.to_thread(snapshot.walk, source)
    left_out = [rel for rel, path in entries if path == Path()]
    if left_out:
        raise TraindError(f"{source}: {', '.join(left_out)} would be left out: only regular "
                          "files, and symlinks to them inside the checkpoint, are stored")
    files = tuple((rel, path.stat().st_size) for rel, path in entries)
    if not files:
        raise TraindError(f"{source} holds no file to store")
    storage = open_storage(settings.storage, settings.run.name)
    try:
        await _refuse_committed(storage, tag)
    finally:
        await storage.aclose()
    return PushPlan(tag, files, storage.describe)


async def push(settings: Settings, source: Path, tag: str | None = None) -> Manifest:
    """Snapshot, upload and commit ``source``; return its manifest."""
    tag, step = _tag_and_step(source, tag)
    state_dir = settings.run.state_dir
    storage = open_storage(settings.storage, settings.run.name)
    journal = Journal.in_state_dir(state_dir, RunIdentity.of(settings))
    try:
        await _refuse_committed(storage, tag)
        streamer = Streamer(settings.run.name, state_dir, storage, journal,
                            claim_ttl=settings.storage.claim_ttl)
        if await streamer.stage(tag, step, source, whole=True) is not StageResult.STAGED:
            raise TraindError(f"{source} could not be snapshot: {streamer.stage_errors[tag]}")
        await journal.set_state(tag, "ready")
        files = await journal.files(tag)
        total = sum(f.size for f in files)
        async with shown(Progress(total), f"push {tag}") as progress:
            return await _contended(tag, lambda: streamer.commit(tag, progress))
    finally:
        await storage.aclose()
        journal.close()


async def _contended(tag: str, commit: Callable[[], Awaitable[Manifest]]) -> Manifest:
    """``commit()``, tried again while another writer's claim collides with ours (a store
    without atomic creates, the same instant); TraindError saying so when it never stops."""
    try:
        return await retrying(commit, PUSH_CONTENDED, PUSH_ATTEMPTS - 1,
                              is_transient=lambda exc: isinstance(exc, ContendedError))
    except ContendedError as exc:
        raise TraindError(f"{exc}; {tag} was tried {PUSH_ATTEMPTS} times and is not stored: "
                          "push again, or let the other writer store it") from exc


def _tag_and_step(source: Path, tag: str | None) -> tuple[str, int]:
    """The tag to push ``source`` under and its step; TraindError when there is none."""
    if not source.is_dir():
        raise TraindError(f"{source} is not a directory")
    tag = check_tag(tag or source.resolve().name)
    step = parse_step(tag)
    if step is None:
        raise TraindError(f"cannot push as {tag!r}: {tag_problem(tag)}; pass --tag "
                          "checkpoint-N")
    return tag, step


async def _refuse_committed(storage: CheckpointStore, tag: str) -> None:
    """TraindError when ``tag`` is already committed: a push never replaces a checkpoint."""
    if (found := await storage.committed(tag)) is not None:
        raise TraindError(
            f"{tag} is already committed in {storage.describe} by writer {found.writer}; a "
            "push never replaces a committed checkpoint: pass --tag to commit this one under "
            "another name"
        )

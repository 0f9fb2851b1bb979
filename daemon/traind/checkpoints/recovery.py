"""Start-up recovery: restore on a fresh host, and pick up what a previous daemon left."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import structlog

from traind.checkpoints.commit import writer
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake import snapshot
from traind.checkpoints.intake.watcher import candidates, tag_problem
from traind.checkpoints.restore.download import (
    find,
    identity,
    restore,
    restore_newest,
    restore_verified,
)
from traind.checkpoints.state.journal import Journal
from traind.config import CheckpointsConfig
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore

log = structlog.get_logger("traind.recovery")


def local_checkpoints(output_dir: Path, config: CheckpointsConfig) -> dict[str, int]:
    """Complete-looking checkpoint directories in ``output_dir`` (a marker present)."""
    found = {}
    for tag, step in candidates(output_dir, config.pattern).items():
        seen = snapshot.observe(output_dir / tag, config.markers)
        if seen is not None and seen.marked:
            found[tag] = step
    return found


async def restore_if_fresh(
    storage: CheckpointStore,
    journal: Journal,
    manifests: list[Manifest],
    output_dir: Path,
    config: CheckpointsConfig,
) -> None:
    """Restore the newest committed checkpoint that verifies when ``output_dir`` holds none;
    a corrupt one is passed over (``restore_newest``), so it never blocks the start."""
    if not manifests:
        return
    if await asyncio.to_thread(local_checkpoints, output_dir, config):
        return

    async def attempt(manifest: Manifest) -> Path:
        log.info("restore_starting", tag=manifest.tag, step=manifest.step,
                 reason="fresh output_dir")
        return await restore(storage, manifest, output_dir)

    restored = await restore_newest(storage, manifests, output_dir, journal, attempt)
    if restored is None:
        log.error("restore_failed", backend=storage.describe, checkpoints=len(manifests),
                  error="no committed checkpoint in the store verifies; starting without one")
        return
    await journal.record_committed(
        restored.tag, restored.step, output_dir / restored.tag, storage.describe
    )


async def without_corrupt(journal: Journal, manifests: list[Manifest]) -> list[Manifest]:
    """``manifests`` less those recorded as corrupt: the trainer saving such a tag again
    makes a checkpoint to upload, not one the store already holds."""
    corrupt = await journal.corrupt()
    return [m for m in manifests if (m.tag, identity(m)) not in corrupt]


async def recover(
    streamer: Streamer, journal: Journal, manifests: list[Manifest] | None
) -> tuple[list[str], list[str]]:
    """Re-track staged snapshots, delete orphaned staging (a conflict's snapshot is kept), and
    settle ready snapshots against the store (``reconcile``); return the tags the watcher
    should keep tracking, and the ready tags still to reconcile when ``manifests`` is None
    (the store not reached yet)."""
    staging = streamer.staging
    keep = {e.tag for e in await journal.entries("conflict")}
    tracked = []
    ready = []
    for entry in await journal.entries("staged", "ready"):
        if (problem := tag_problem(entry.tag)) is not None:
            # Journalled by a version that took any matching name: its snapshot is dropped.
            log.warning("recovered_skipped", tag=entry.tag, state=entry.state, reason=problem)
            continue
        have_snapshot = (staging / entry.tag).is_dir()
        if entry.state == "ready":
            ready.append(entry.tag)
            if have_snapshot:
                keep.add(entry.tag)
        elif have_snapshot or entry.source.exists():
            keep.add(entry.tag)
            tracked.append(entry.tag)
            log.info("recovered_staged", tag=entry.tag)
        else:
            log.warning("recovered_lost", tag=entry.tag, state=entry.state)
    if staging.is_dir():
        for path in staging.iterdir():
            if path.name not in keep:
                await asyncio.to_thread(shutil.rmtree, path, True)
                log.info("staging_orphan_removed", path=str(path))
    # Acks belong to the trainer this daemon is about to start; stale ones would let it
    # rotate a checkpoint away before it is snapshot.
    await asyncio.to_thread(shutil.rmtree, streamer.acks, True)
    if manifests is None:
        return tracked, ready
    await reconcile(streamer, journal, manifests, ready)
    return tracked, []


async def reconcile(
    streamer: Streamer, journal: Journal, manifests: list[Manifest], ready: list[str]
) -> None:
    """Once the store answered: mark as committed the ``ready`` tags it holds, queue the
    others whose snapshot is there, and remove what interrupted uploads left in the store.
    Another writer's manifest of the same tag is not ours: the claim tells the streamer."""
    remote = writer.written_by(manifests, await streamer.writer())
    for tag in ready:
        if tag in remote:
            await journal.set_state(tag, "committed")
            await asyncio.to_thread(shutil.rmtree, streamer.staging / tag, True)
            log.info("recovered_committed", tag=tag)
        elif (streamer.staging / tag).is_dir():
            streamer.enqueue(tag)
            log.info("recovered_upload", tag=tag)
        else:
            log.warning("recovered_lost", tag=tag, state="ready")
    states = [state for _, _, state in await journal.resume_states()]
    removed = await streamer.storage.cleanup(states)
    if removed:
        log.info("store_leftovers_removed", count=removed, backend=streamer.storage.describe)


async def resume_point(
    storage: CheckpointStore, journal: Journal, output_dir: Path, config: CheckpointsConfig
) -> Path | None:
    """The newest complete checkpoint as a local directory the trainer can resume from;
    None before the first.

    Complete means committed, or complete and waiting for its upload (``ready``) or kept
    after a conflict (this trainer's own progress, another writer's in the store), and on
    disk as it was snapshot: resuming from an older one would make the trainer save the
    waiting ones again, over the files their snapshots share, and a directory saved again
    since (perhaps torn by a crash mid-save) is no resume point. A committed one missing
    or changed on disk is restored from the store first; corrupt there too, the next
    older one is tried.
    """
    for entry in reversed(await journal.entries("committed", "ready", "conflict")):
        if tag_problem(entry.tag) is not None:
            continue  # journalled by an older version that took any matching name
        path = output_dir / entry.tag
        reason = await _unusable(journal, entry.tag, path, config)
        if reason is None:
            return path
        if entry.state == "committed":
            log.info("restore_starting", tag=entry.tag, step=entry.step, reason=reason)
            await asyncio.to_thread(shutil.rmtree, path, True)
            manifest = await find(storage, entry.tag)
            if await restore_verified(storage, manifest, output_dir, journal) is None:
                continue  # corrupt in the store too: an older one
            await journal.record_committed(entry.tag, entry.step, path, storage.describe)
            return path
    return None


async def local_resume_point(
    journal: Journal, output_dir: Path, config: CheckpointsConfig
) -> Path | None:
    """What ``resume_point`` returns when it can answer without the store: None when there
    is no resume point, or when the newest committed one must be restored first."""
    for entry in reversed(await journal.entries("committed", "ready", "conflict")):
        if tag_problem(entry.tag) is not None:
            continue  # journalled by an older version that took any matching name
        path = output_dir / entry.tag
        if await _unusable(journal, entry.tag, path, config) is None:
            return path
        if entry.state == "committed":
            return None
    return None


async def _unusable(
    journal: Journal, tag: str, path: Path, config: CheckpointsConfig
) -> str | None:
    """Why the checkpoint ``tag`` at ``path`` is no resume point as it is on disk, or None."""
    seen = await asyncio.to_thread(snapshot.observe, path, config.markers)
    if seen is None or not seen.marked:
        return "resume point missing"
    if changed := await asyncio.to_thread(snapshot.rewritten, path, await journal.files(tag)):
        return f"saved again: {', '.join(changed)}"
    return None

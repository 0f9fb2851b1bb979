"""Start-up recovery: restore on a fresh host, and pick up what a previous daemon left."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import structlog

from traind.checkpoints import snapshot
from traind.checkpoints.journal import Journal
from traind.checkpoints.manifest import Manifest
from traind.checkpoints.restore import find, newest, restore
from traind.checkpoints.streamer import Streamer
from traind.checkpoints.watcher import candidates
from traind.config import CheckpointsConfig
from traind.storage.base import Storage

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
    storage: Storage,
    journal: Journal,
    manifests: list[Manifest],
    output_dir: Path,
    config: CheckpointsConfig,
) -> None:
    """Restore the newest committed checkpoint when ``output_dir`` holds none."""
    latest = newest(manifests)
    if latest is None:
        return
    if await asyncio.to_thread(local_checkpoints, output_dir, config):
        return
    log.info("restore_starting", tag=latest.tag, step=latest.step, reason="fresh output_dir")
    await restore(storage, latest, output_dir)
    await journal.record_committed(
        latest.tag, latest.step, output_dir / latest.tag, storage.describe
    )


async def recover(streamer: Streamer, journal: Journal, manifests: list[Manifest]) -> list[str]:
    """Queue ready snapshots, re-track staged ones, mark as committed what reached the store,
    delete orphaned staging (a conflict's snapshot is kept); return the tags the watcher
    should keep tracking."""
    ours = await streamer.writer()
    remote = {m.tag for m in manifests if m.writer is None or m.writer.id == ours.id}
    staging = streamer.staging
    keep = {e.tag for e in await journal.entries("conflict")}
    tracked = []
    for entry in await journal.entries("staged", "ready"):
        have_snapshot = (staging / entry.tag).is_dir()
        if entry.tag in remote and entry.state == "ready":
            await journal.set_state(entry.tag, "committed")
            log.info("recovered_committed", tag=entry.tag)
        elif entry.state == "ready" and have_snapshot:
            keep.add(entry.tag)
            streamer.enqueue(entry.tag)
            log.info("recovered_upload", tag=entry.tag)
        elif entry.state == "staged" and (have_snapshot or entry.source.exists()):
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
    states = [state for _, _, state in await journal.resume_states()]
    removed = await streamer.storage.cleanup(states)
    if removed:
        log.info("store_leftovers_removed", count=removed, backend=streamer.storage.describe)
    return tracked


async def resume_point(
    storage: Storage, journal: Journal, output_dir: Path, config: CheckpointsConfig
) -> Path | None:
    """The newest complete checkpoint as a local directory the trainer can resume from;
    None before the first.

    Complete means committed, or complete and waiting for its upload (``ready``) or kept
    after a conflict (this trainer's own progress, another writer's in the store), and on
    disk as it was snapshot: resuming from an older one would make the trainer save the
    waiting ones again, over the files their snapshots share, and a directory saved again
    since (perhaps torn by a crash mid-save) is no resume point. A committed one missing
    or changed on disk is restored from the store first.
    """
    for entry in reversed(await journal.entries("committed", "ready", "conflict")):
        path = output_dir / entry.tag
        seen = await asyncio.to_thread(snapshot.observe, path, config.markers)
        if seen is None or not seen.marked:
            reason = "resume point missing"
        elif changed := await asyncio.to_thread(
            snapshot.rewritten, path, await journal.files(entry.tag)
        ):
            reason = f"saved again: {', '.join(changed)}"
        else:
            return path
        if entry.state == "committed":
            log.info("restore_starting", tag=entry.tag, step=entry.step, reason=reason)
            await asyncio.to_thread(shutil.rmtree, path, True)
            await restore(storage, await find(storage, entry.tag), output_dir)
            await journal.record_committed(entry.tag, entry.step, path, storage.describe)
            return path
    return None

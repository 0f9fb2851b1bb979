"""``traind push``: commit one checkpoint directory by hand, through the same pipeline.

The directory is snapshot into a private staging area and committed by the streamer, so a
manual push is verified and journalled exactly like one the daemon found itself.
"""

from __future__ import annotations

from pathlib import Path

from traind.checkpoints.identity import RunIdentity
from traind.checkpoints.journal import Journal
from traind.checkpoints.manifest import Manifest
from traind.checkpoints.streamer import Streamer
from traind.checkpoints.watcher import StageResult, parse_step
from traind.config import Settings
from traind.errors import TraindError
from traind.progress import Progress, shown
from traind.storage.factory import open_storage
from traind.storage.keys import check_tag


async def push(settings: Settings, source: Path, tag: str | None = None) -> Manifest:
    """Snapshot, upload and commit ``source``; return its manifest."""
    if not source.is_dir():
        raise TraindError(f"{source} is not a directory")
    tag = check_tag(tag or source.resolve().name)
    step = parse_step(tag)
    if step is None:
        raise TraindError(f"cannot read a step number from tag {tag!r}; pass --tag checkpoint-N")
    state_dir = settings.run.state_dir
    storage = open_storage(settings.storage, settings.run.name)
    journal = Journal.in_state_dir(state_dir, RunIdentity.of(settings, storage))
    try:
        if any(m.tag == tag for m in await storage.manifests()):
            raise TraindError(
                f"{tag} is already committed in {storage.describe}; a push never replaces a "
                "committed checkpoint: pass --tag to commit this one under another name"
            )
        streamer = Streamer(settings.run.name, state_dir, storage, journal,
                            claim_ttl=settings.storage.claim_ttl)
        if await streamer.stage(tag, step, source, whole=True) is not StageResult.STAGED:
            raise TraindError(f"{source} could not be snapshot: {streamer.stage_errors[tag]}")
        await journal.set_state(tag, "ready")
        files = await journal.files(tag)
        total = sum(f.size for f in files)
        async with shown(Progress(total), f"push {tag}") as progress:
            return await streamer.commit(tag, progress)
    finally:
        await storage.aclose()
        journal.close()

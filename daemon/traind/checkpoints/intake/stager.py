"""Taking a checkpoint in: its snapshot (hard links into staging) journalled, the space it
takes reported, and the trainer's callback told it may rotate the directory away."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from traind.checkpoints.intake import snapshot
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.state.journal import Journal
from traind.errors import TraindError

log = structlog.get_logger("traind.streamer")
OnStaged = Callable[[int], Awaitable[None]]


class Stager:
    """Snapshots into ``staging``, journalled in ``journal``, acknowledged in ``acks``;
    ``parts``: this host's checkpoints are parts of a multi-node job's."""

    def __init__(self, staging: Path, acks: Path, journal: Journal, parts: bool,
                 on_staged: OnStaged | None = None) -> None:
        self._staging = staging
        self._acks = acks
        self._journal = journal
        self._parts = parts
        self.on_staged = on_staged
        """Told the size of each snapshot just taken, before the trainer hears of it (the
        free-space check: the trainer's next save must fit)."""
        self.errors: dict[str, str] = {}
        """Why the last attempt to snapshot a tag failed (until one succeeds)."""

    async def stage(self, tag: str, step: int, source: Path, whole: bool = False) -> StageResult:
        """Snapshot ``source`` into staging and journal it; with ``whole`` (a push by hand),
        a file that would be left out fails it rather than being reported."""
        started = time.monotonic()
        try:
            await asyncio.to_thread(self._staging.mkdir, parents=True, exist_ok=True)
            snap = await asyncio.to_thread(snapshot.take, source, self._staging / tag, whole,
                                           self._parts)
        except snapshot.SourceVanishedError as exc:
            log.warning("checkpoint_vanished", tag=tag, step=step, error=str(exc))
            self.errors[tag] = str(exc)
            return StageResult.GONE
        except TraindError as exc:
            log.error("checkpoint_unusable", tag=tag, step=step, error=str(exc))
            self.errors[tag] = str(exc)
            return StageResult.GONE
        except OSError as exc:  # disk full, permissions: the next scan tries again
            if self.errors.get(tag) != str(exc):
                log.error("checkpoint_snapshot_failed", tag=tag, step=step, error=str(exc),
                          hint="retrying on every scan; free space in state_dir")
            self.errors[tag] = str(exc)
            return StageResult.RETRY
        self.errors.pop(tag, None)
        await self._journal.staged(tag, step, source, snap.files)
        if self.on_staged is not None:
            await self.on_staged(snap.total_bytes)
        try:
            await asyncio.to_thread(_ack, self._acks, tag)
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

    async def rewritten(self, exc: snapshot.RewrittenError) -> None:
        """Let go of a snapshot the trainer wrote over; the checkpoint is snapshot again
        once it is complete again (the journal's ``staged`` state survives a restart too)."""
        log.error(
            "checkpoint_rewritten", tag=exc.tag, paths=exc.paths,
            hint="the trainer saved this checkpoint again after it was complete; it is "
                 "snapshot and stored anew once complete, if it is still in output_dir",
        )
        await self._journal.set_state(exc.tag, "staged")
        await asyncio.to_thread(shutil.rmtree, self._staging / exc.tag, True)


def _ack(acks: Path, tag: str) -> None:
    """Tell a waiting ``TraindCallback`` that ``tag`` is snapshot (see ``ACK_DIR_ENV``)."""
    acks.mkdir(parents=True, exist_ok=True)
    (acks / tag).touch()

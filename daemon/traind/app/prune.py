"""The daemon's retention loop: prune after each commit and every ``retention.interval``
(re-read on reload), the store's checkpoints on node 0 of a job and output_dir's on every
host; node 0 also gives up checkpoints whose parts never all came."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from traind.app.observe import Observer
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.retention import pruner
from traind.checkpoints.state.journal import Journal
from traind.config import Settings
from traind.protocol import CheckpointStore
from traind.util.nodes import NodeRank

log = structlog.get_logger("traind.app")


class Pruning:
    """Retention for the settings and store the daemon holds now (both may be reloaded)."""

    def __init__(self, settings: Callable[[], Settings], storage: Callable[[], CheckpointStore],
                 journal: Journal, streamer: Streamer, node: NodeRank,
                 observer: Observer) -> None:
        self._settings = settings
        self._storage = storage
        self._journal = journal
        self._streamer = streamer
        self._node = node
        self._observer = observer
        self._now = asyncio.Event()
        self.resuming: tuple[str, ...] = ()
        """The checkpoint the trainer resumes from: never deleted from output_dir."""

    def soon(self) -> None:
        """Prune at once (a checkpoint was just committed)."""
        self._now.set()

    async def run(self) -> None:
        """Prune on the schedule and when asked, until cancelled; a failed prune is logged
        and never stops the daemon."""
        while True:
            interval = self._settings().retention.interval
            self._observer.next_prune = time.time() + interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._now.wait()
            self._now.clear()
            s = self._settings()
            try:
                plan = await pruner.prune(
                    self._storage(), self._journal, s.retention, s.run.output_dir,
                    s.checkpoints.pattern, self.resuming, remote=self._node.rank == 0,
                )
                if self._node.nodes > 1 and self._node.rank == 0:
                    await pruner.give_up_stranded(self._streamer, self._node.nodes,
                                                  s.run.part_timeout)
            except Exception as exc:  # a failed prune must never stop the daemon
                log.error("prune_failed", error=str(exc))
            else:
                self._observer.pruned([v.tag for v in plan.remote if not v.keep])

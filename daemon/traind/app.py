"""The daemon: start-up, main loop, shutdown — in that order, and nothing else.

One TaskGroup owns every long-lived task; cancelling it is the shutdown. Signal handlers
only set events.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import structlog

from traind import config
from traind.checkpoints import pruner
from traind.checkpoints.journal import Journal
from traind.checkpoints.manifest import Manifest
from traind.checkpoints.restore import newest, restore
from traind.checkpoints.snapshot import observe
from traind.checkpoints.streamer import Streamer
from traind.checkpoints.watcher import Watcher, candidates
from traind.config import Settings
from traind.errors import ConfigError, TraindError
from traind.reload import plan_reload
from traind.storage.base import Storage
from traind.storage.factory import open_storage

log = structlog.get_logger("traind.app")


class Daemon:
    """Watches the run's output_dir and streams every complete checkpoint to storage."""

    def __init__(
        self, settings: Settings, storage: Storage | None = None, config_path: Path | None = None
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.storage = storage or open_storage(settings.storage, settings.run.name)
        state_dir = settings.run.state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal.in_state_dir(state_dir)
        self.streamer = Streamer(
            settings.run.name, state_dir, self.storage, self.journal, self._committed
        )
        self._prune_now = asyncio.Event()

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set, re-reading the config whenever ``reload`` is set."""
        try:
            watcher = await self.startup()
            await self.main_loop(watcher, stop, reload or asyncio.Event())
        finally:
            await self.storage.aclose()
            self.journal.close()
            log.info("daemon_stopped")

    async def startup(self) -> Watcher:
        """Restore if this is a fresh host, recover unfinished work, build the watcher."""
        run = self.settings.run
        log.info(
            "daemon_starting",
            run=run.name,
            output_dir=str(run.output_dir),
            state_dir=str(run.state_dir),
            backend=self.storage.describe,
        )
        manifests = await self.storage.manifests()
        await self._restore_if_fresh(manifests)
        tracked = await self._recover(manifests)
        done = {e.tag for e in await self.journal.entries("ready", "committed", "pruned")}
        done |= {m.tag for m in manifests}
        return Watcher(
            self.settings.checkpoints,
            run.output_dir,
            self.streamer.stage,
            self.streamer.complete,
            done,
            tracked,
        )

    async def main_loop(self, watcher: Watcher, stop: asyncio.Event, reload: asyncio.Event) -> None:
        """Watch, stream and prune until ``stop``; then finish or park the upload in flight."""
        log.info("daemon_ready")
        async with asyncio.TaskGroup() as tg:
            watching = tg.create_task(watcher.run(), name="watcher")
            streaming = tg.create_task(self.streamer.run(), name="streamer")
            pruning = tg.create_task(self._retention_loop(), name="retention")
            reloading = tg.create_task(self._reload_loop(reload), name="reload")
            await stop.wait()
            log.info("daemon_stopping")
            reloading.cancel()
            watching.cancel()
            pruning.cancel()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.run.stop_timeout):
                    await self.streamer.wait_idle()
            streaming.cancel()

    async def _restore_if_fresh(self, manifests: list[Manifest]) -> None:
        run = self.settings.run
        latest = newest(manifests)
        if latest is None or await asyncio.to_thread(self._has_local_checkpoint):
            return
        log.info("restore_starting", tag=latest.tag, step=latest.step, reason="fresh output_dir")
        await restore(self.storage, latest, run.output_dir)
        await self.journal.record_committed(
            latest.tag, latest.step, run.output_dir / latest.tag, self.storage.describe
        )

    def _has_local_checkpoint(self) -> bool:
        run, ckpt = self.settings.run, self.settings.checkpoints
        for tag in candidates(run.output_dir, ckpt.pattern):
            seen = observe(run.output_dir / tag, ckpt.markers)
            if seen is not None and (seen.has_marker or seen.explicit):
                return True
        return False

    async def _recover(self, manifests: list[Manifest]) -> list[str]:
        """Resume what a previous daemon left: queue ready snapshots, re-track staged ones,
        mark as committed what reached the store, and delete orphaned staging dirs."""
        remote = {m.tag: m for m in manifests}
        staging = self.streamer.staging
        keep: set[str] = set()
        tracked = []
        for entry in await self.journal.entries("staged", "ready"):
            have_snapshot = (staging / entry.tag).is_dir()
            if entry.tag in remote and entry.state == "ready":
                await self.journal.set_state(entry.tag, "committed")
                log.info("recovered_committed", tag=entry.tag)
            elif entry.state == "ready" and have_snapshot:
                keep.add(entry.tag)
                self.streamer.enqueue(entry.tag)
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
        return tracked

    async def _reload_loop(self, reload: asyncio.Event) -> None:
        while True:
            await reload.wait()
            reload.clear()
            await self.reload()

    async def reload(self) -> None:
        """Re-read the config file; apply what can change live, report the rest.

        An invalid file changes nothing. A new storage backend is probed before it is used;
        the upload in flight finishes on the old one (see ``Streamer.replace_storage``).
        """
        path = self.config_path
        if path is None:
            log.warning("reload_ignored", reason="daemon was not started from a config file")
            return
        try:
            new = await asyncio.to_thread(config.load, path)
        except ConfigError as exc:
            log.error("reload_rejected", config=str(path), problems=exc.problems)
            return
        plan = plan_reload(self.settings, new)
        if "storage" in plan.applied:
            storage = open_storage(new.storage, new.run.name)
            try:
                await storage.probe()
            except TraindError as exc:
                await storage.aclose()
                log.error("reload_rejected", config=str(path), problems=[f"storage: {exc}"])
                return
            old = await self.streamer.replace_storage(storage)
            self.storage = storage
            await old.aclose()
        self.settings = plan.effective
        log.info(
            "reload_applied",
            applied=list(plan.applied),
            needs_restart=list(plan.needs_restart),
            backend=self.storage.describe,
        )
        if plan.needs_restart:
            log.warning(
                "reload_needs_restart",
                sections=list(plan.needs_restart),
                hint="systemctl restart traind",
            )

    async def _committed(self, manifest: Manifest) -> None:
        self._prune_now.set()

    async def _retention_loop(self) -> None:
        """Prune after each commit and every ``retention.interval``."""
        policy = self.settings.retention
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(policy.interval):
                    await self._prune_now.wait()
            self._prune_now.clear()
            try:
                await pruner.prune(
                    self.storage,
                    self.journal,
                    policy,
                    self.settings.run.output_dir,
                    self.settings.checkpoints.pattern,
                )
            except Exception as exc:  # a failed prune must never stop the daemon
                log.error("prune_failed", error=str(exc))

"""The daemon: start-up, main loop, shutdown — in that order.

One TaskGroup owns every long-lived task; cancelling it is the shutdown. Signal handlers
only set events.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from pathlib import Path

import structlog

from traind import config
from traind.checkpoints import pruner, recovery
from traind.checkpoints.journal import Journal
from traind.checkpoints.manifest import Manifest
from traind.checkpoints.streamer import Streamer
from traind.checkpoints.watcher import StageResult, Watcher
from traind.config import Settings, StatusConfig
from traind.errors import ConfigError, TraindError, TransientStorageError
from traind.observe import Observer
from traind.reload import plan_reload
from traind.status.model import RecentErrors
from traind.status.server import StatusServer
from traind.storage.base import Storage
from traind.storage.factory import open_storage
from traind.supervisor.leftovers import stop_leftovers
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.supervisor import Supervisor

log = structlog.get_logger("traind.app")


class Daemon:
    """Supervises the run's processes and streams every complete checkpoint to storage."""

    def __init__(
        self,
        settings: Settings,
        storage: Storage | None = None,
        config_path: Path | None = None,
        recent: RecentErrors | None = None,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.storage = storage or open_storage(settings.storage, settings.run.name)
        state_dir = settings.run.state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_state_dir(state_dir)
        self.journal = Journal.in_state_dir(state_dir)
        self.streamer = Streamer(
            settings.run.name, state_dir, self.storage, self.journal, self._committed
        )
        self.supervisor: Supervisor | None = None
        self.watcher: Watcher | None = None
        self.observer = Observer(
            settings.run.name,
            self.streamer,
            lambda: self.storage.describe,
            lambda: self.watcher.tracking if self.watcher else 0,
            recent,
        )
        self._server: StatusServer | None = None
        self._prune_now = asyncio.Event()
        self._resuming: tuple[str, ...] = ()

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set, re-reading the config whenever ``reload`` is set.

        systemd hears READY=1 as soon as the loop is up — a restore or a loading vLLM can take
        many minutes and must not hit the start timeout — and watchdog pings from then on.
        """
        notifier = self.observer.notifier
        notifier.ready()
        try:
            async with asyncio.TaskGroup() as tg:
                watchdog = tg.create_task(notifier.watchdog_loop(), name="watchdog")
                await self._serve_status(self.settings.status)
                self.observer.announce()
                starting = tg.create_task(self.startup(), name="startup")
                stopping = tg.create_task(stop.wait(), name="stop-during-startup")
                await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if stop.is_set():
                    starting.cancel()
                    log.info("daemon_stopping", during="startup")
                else:
                    self.watcher = starting.result()
                    self.observer.set_state("running")
                    await self.main_loop(self.watcher, stop, reload or asyncio.Event())
                watchdog.cancel()
        finally:
            notifier.stopping()
            await self._serve_status(None)
            await self.storage.aclose()
            self.journal.close()
            if self._lock is not None:
                os.close(self._lock)
            log.info("daemon_stopped")

    async def startup(self) -> Watcher:
        """Stop what a killed predecessor left running, restore if this is a fresh host,
        recover unfinished work, build the watcher."""
        s = self.settings
        log.info(
            "daemon_starting",
            run=s.run.name,
            output_dir=str(s.run.output_dir),
            state_dir=str(s.run.state_dir),
            backend=self.storage.describe,
        )
        await stop_leftovers(s.run.state_dir, [s.trainer, s.vllm, *s.services])
        manifests = await self._store_manifests()
        self.observer.known(manifests)
        await recovery.restore_if_fresh(
            self.storage, self.journal, manifests, s.run.output_dir, s.checkpoints
        )
        manifests = await recovery.without_corrupt(self.journal, manifests)
        tracked = await recovery.recover(self.streamer, self.journal, manifests)
        done = {e.tag for e in await self.journal.entries("ready", "committed", "pruning",
                                                          "pruned")}
        done |= {m.tag for m in manifests}
        if s.trainer or s.vllm or s.services:
            become_subreaper()
            self.supervisor = Supervisor(
                state_dir=s.run.state_dir,
                vllm=s.vllm,
                services=s.services,
                trainer=s.trainer,
                resume_from=self._resume_point,
                on_change=self.observer.child_changed,
            )
            self.observer.supervisor = self.supervisor
        watcher = Watcher(
            s.checkpoints, s.run.output_dir, self._stage, self.streamer.complete, done, tracked
        )
        self.streamer.on_rewritten = watcher.reopen
        return watcher

    async def _store_manifests(self) -> list[Manifest]:
        """The store's manifests. A store that is down for now (network not up yet, server
        restarting) is waited for: whether to restore before the trainer starts depends on
        it. A permanent error (bad credentials, no such bucket) ends the start-up."""
        delay = 1.0
        while True:
            try:
                return await self.storage.manifests()
            except TransientStorageError as exc:
                log.error(
                    "store_unreachable",
                    backend=self.storage.describe,
                    error=str(exc),
                    retry_in=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)

    async def main_loop(self, watcher: Watcher, stop: asyncio.Event, reload: asyncio.Event) -> None:
        """Supervise, watch, stream and prune until ``stop``; then shut down in order: the
        children (trainer first), the watcher, then the upload in flight within
        ``stop_timeout`` (whatever is left stays in the journal for next time)."""
        log.info("daemon_ready")
        async with asyncio.TaskGroup() as tg:
            background = [
                tg.create_task(self._retention_loop(), name="retention"),
                tg.create_task(self._reload_loop(reload), name="reload"),
            ]
            if self.supervisor is not None:
                background.append(tg.create_task(self._supervise(stop), name="supervisor"))
            watching = tg.create_task(watcher.run(), name="watcher")
            streaming = tg.create_task(self.streamer.run(), name="streamer")
            await stop.wait()
            log.info("daemon_stopping")
            self.observer.notifier.stopping()
            self.observer.set_state("stopping")
            if self.supervisor is not None:
                await self.supervisor.stop()
            for task in [*background, watching]:
                task.cancel()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.run.stop_timeout):
                    await self.streamer.wait_idle()
            streaming.cancel()

    async def _supervise(self, stop: asyncio.Event) -> None:
        """Run the children; when training finished, commit what is left, then stop."""
        assert self.supervisor is not None
        outcome = await self.supervisor.run()
        if outcome != "finished":
            log.error(
                "supervision_ended",
                outcome=outcome,
                hint="checkpoint streaming continues; see the child_* events",
            )
            return
        # The last checkpoint may still be settling: let the watcher see it, then drain.
        await asyncio.sleep(
            self.settings.checkpoints.settle + 2 * self.settings.checkpoints.poll_interval
        )
        if self.streamer.pending:
            log.info("run_waiting_for_uploads", checkpoints=self.streamer.pending,
                     hint="the daemon exits once every checkpoint is committed")
        await self.streamer.wait_idle()
        log.info(
            "run_complete",
            exit=bool(self.settings.trainer and self.settings.trainer.exit_when_done),
        )
        if self.settings.trainer is not None and self.settings.trainer.exit_when_done:
            stop.set()

    async def _stage(self, tag: str, step: int, source: Path) -> StageResult:
        result = await self.streamer.stage(tag, step, source)
        if result is StageResult.STAGED and self.supervisor is not None:
            self.supervisor.notify_progress()
        return result

    async def _resume_point(self) -> Path | None:
        s = self.settings
        path = await recovery.resume_point(
            self.storage, self.journal, s.run.output_dir, s.checkpoints
        )
        # Local retention must not delete it while the trainer loads it (or later).
        self._resuming = () if path is None else (path.name,)
        # One passed over as corrupt in the store is saved again by the trainer: store it
        # (the record goes once it is committed again).
        if self.watcher is not None:
            for tag, _ in await self.journal.corrupt():
                self.watcher.reopen(tag)
        return path

    async def _committed(self, manifest: Manifest) -> None:
        self.observer.committed(manifest)
        await self.journal.forget_corrupt(manifest.tag)  # stored anew over a corrupt one
        self._prune_now.set()

    async def _retention_loop(self) -> None:
        """Prune after each commit and every ``retention.interval`` (re-read on reload)."""
        while True:
            interval = self.settings.retention.interval
            self.observer.next_prune = time.time() + interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._prune_now.wait()
            self._prune_now.clear()
            s = self.settings
            try:
                plan = await pruner.prune(
                    self.storage, self.journal, s.retention, s.run.output_dir,
                    s.checkpoints.pattern, self._resuming,
                )
            except Exception as exc:  # a failed prune must never stop the daemon
                log.error("prune_failed", error=str(exc))
            else:
                self.observer.pruned([v.tag for v in plan.remote if not v.keep])

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
        self.observer.notifier.reloading()
        try:
            await self._apply(path)
        finally:
            self.observer.notifier.ready()
            self.observer.announce()

    async def _apply(self, path: Path) -> None:
        try:
            new = await asyncio.to_thread(config.load, path)
        except ConfigError as exc:
            log.error("reload_rejected", config=str(path), problems=exc.problems)
            return
        plan = plan_reload(self.settings, new)
        if "status" in plan.applied:
            try:
                await self._serve_status(new.status)
            except TraindError as exc:
                log.error("reload_rejected", config=str(path), problems=[f"status: {exc}"])
                await self._serve_status(self.settings.status)
                return
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

    async def _serve_status(self, status: StatusConfig | None) -> None:
        """(Re)start the status server for ``status``, or stop it when None or disabled."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if status is not None and status.enabled:
            server = StatusServer(status.listen, self.observer.snapshot, self.observer.metrics)
            await server.start()
            self._server = server


def _lock_state_dir(state_dir: Path) -> int | None:
    """Hold ``state_dir/traind.lock`` for this daemon's life (its descriptor; released by
    the kernel however the process ends). A second daemon of the same state_dir would share
    its journal and staging, and stop its children as leftovers: it is refused instead.
    None where the filesystem has no locks (a warning says so)."""
    fd = os.open(state_dir / "traind.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise TraindError(
            f"another traind (pid {holder}) is running with run.state_dir {state_dir}; stop "
            "it first, or give this one a state_dir of its own"
        ) from None
    except OSError as exc:
        os.close(fd)
        log.warning("state_dir_unlocked", state_dir=str(state_dir), error=str(exc),
                    hint="two daemons on this state_dir would not be noticed")
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd

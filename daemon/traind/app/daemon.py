"""The daemon: start-up, main loop, shutdown — in that order.

One TaskGroup owns every long-lived task; cancelling it is the shutdown. Signal handlers
only set events.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from traind import config
from traind.app import store_wait
from traind.app.observe import Observer
from traind.app.prune import Pruning
from traind.app.reconfigure import reconfigure
from traind.app.shutdown import Running, shut_down, supervise
from traind.app.state_dir import StateDir
from traind.checkpoints.commit import writer
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake import completion
from traind.checkpoints.intake.watcher import StageResult, Watcher
from traind.checkpoints.multinode.resume import JointResume
from traind.checkpoints.restore import recovery
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.checkpoints.state.reserve import free_bytes
from traind.checkpoints.state.space import SpaceGuard
from traind.config import HFStorage, Settings, StatusConfig
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore, open_storage
from traind.status.model import RecentErrors
from traind.supervisor.leftovers import stop_leftovers
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.reaper import reap_forever
from traind.supervisor.supervisor import Supervisor
from traind.util.nodes import NodeRank
from traind.util.proc import priority
from traind.util.runtime import long_lived
from traind.util.tasks import each_time
from traind.util.units import parse_floor

log = structlog.get_logger("traind.app")
_STREAMING_HINT = "the trainer runs meanwhile; checkpoints are snapshot and wait in staging"


class Daemon:
    """Supervises the run's processes and streams every complete checkpoint to storage.

    Built by ``open``, which does the I/O (the state_dir lock, the journal) before anything
    else; ``run`` is start-up, main loop and ordered shutdown, in that order."""

    def __init__(
        self,
        settings: Settings,
        storage: CheckpointStore,
        state: StateDir,
        config_path: Path | None = None,
        recent: RecentErrors | None = None,
        *,
        restore: bool = True,
    ) -> None:
        self.settings = settings
        self._restore = restore and settings.run.restore
        """Whether a fresh output_dir is restored at start (``traind run --no-restore``)."""
        self.config_path = config_path
        self.storage = storage
        self._state = state
        self.journal = state.journal
        self.node = config.node_rank(settings)
        self.streamer = _streamer(settings, storage, state.journal, self.node,
                                  self._committed, self._staged)
        self.supervisor: Supervisor | None = None
        self.watcher: Watcher | None = None
        self.observer = Observer(
            settings.run.name, self.streamer, lambda: self.storage.describe,
            lambda: self.watcher.tracking if self.watcher else 0, recent,
            retention=lambda: self.settings.retention, prunes_remote=self.node.rank == 0,
        )
        self.space = SpaceGuard(
            settings.run.output_dir, self.streamer, self.journal,
            parse_floor(settings.checkpoints.min_free_space), self.observer.dropped,
            settings.checkpoints.pattern,
        )
        self.observer.metrics.set_disk(lambda: _free(self.settings.run.output_dir),
                                       lambda: float(self.space.floor()))
        self.joint = (JointResume(self.node, lambda: self.streamer.parts_settled,
                                  self._hand_on_left,
                                  settings.run.state_dir / "resume-request.json")
                      if self.node.nodes > 1 and settings.trainer is not None else None)
        """With nodes > 1 and a trainer: the hosts' agreement on its resume point."""
        self.observer.joint = self.joint
        self.pruning = Pruning(lambda: self.settings, lambda: self.storage, self.journal,
                               self.streamer, self.node, self.observer)
        self.unstored: list[str] = []
        """After ``run``: the checkpoints not committed when it stopped, newest first."""
        self.failed_with: int | None = None
        """After ``run``: ``traind run``'s exit status when ``exit_when_failed`` stopped it."""
        self._reached = False
        self._unreconciled: list[str] = []
        self._done: set[str] = set()

    @classmethod
    async def open(
        cls,
        settings: Settings,
        storage: CheckpointStore | None = None,
        config_path: Path | None = None,
        recent: RecentErrors | None = None,
        *,
        restore: bool = True,
    ) -> Daemon:
        """Take run.state_dir and open the run's journal (``StateDir.open``), then build the
        daemon; a second daemon on the same state_dir is refused here, before it does
        anything. The daemon lets them go when its ``run`` ends."""
        storage = storage or open_storage(settings.storage, settings.run.name)
        state = await asyncio.to_thread(
            StateDir.open, settings.run.state_dir, RunIdentity.of(settings)
        )
        return cls(settings, storage, state, config_path, recent, restore=restore)

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set, re-reading the config whenever ``reload`` is set: start
        up, run the main loop, shut down in order; then let go of what the daemon holds.

        systemd hears READY=1 as soon as the loop is up — a restore or a loading vLLM can take
        many minutes and must not hit the start timeout — and watchdog pings from then on.
        """
        notifier = self.observer.notifier
        notifier.ready()
        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                watchdog = tg.create_task(notifier.watchdog_loop(), name="watchdog")
                watcher = await self.startup(tg, stop)
                if watcher is not None:
                    tasks = await self.main_loop(tg, watcher, stop, reload or asyncio.Event())
                    await self.shutdown(watcher, tasks)
                watchdog.cancel()
        except Exception as exc:  # a task failed: the daemon stops, and says so
            failure = exc
            raise
        finally:
            await self.close(failure)

    async def startup(self, tg: asyncio.TaskGroup, stop: asyncio.Event) -> Watcher | None:
        """Serve status, then prepare the run (``_prepare``) unless ``stop`` comes first.
        Returns the watcher, or None when stopped during start-up."""
        await self._serve_status(self.settings.status)
        self.observer.announce()
        starting = tg.create_task(self._prepare(), name="startup")
        stopping = tg.create_task(stop.wait(), name="stop-during-startup")
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if stop.is_set():
            starting.cancel()
            log.info("daemon_stopping", during="startup")
            return None
        self.watcher = starting.result()
        self.observer.set_state("running")
        return self.watcher

    async def _prepare(self) -> Watcher:
        """Stop what a killed predecessor left running, restore if this is a fresh host,
        recover unfinished work, build the watcher."""
        s = self.settings
        node = self.node
        log.info("daemon_starting", run=s.run.name, run_key=self.journal.run.key,
                 output_dir=str(s.run.output_dir), state_dir=str(s.run.state_dir),
                 backend=self.storage.describe, nodes=node.nodes, node_rank=node.rank,
                 node_rank_from=node.source, transfer_nice=priority.transfer_nice())
        await stop_leftovers(s.run.state_dir, [s.trainer, s.vllm, *s.services])
        for pinned in self._state.dropped:  # let go to open the journal at all
            await self.journal.set_state(pinned.tag, "dropped")
            self.observer.dropped(pinned)
        await self.space.check_safely()  # a disk that filled before a restart: room first
        manifests = await store_wait.first_manifests(self.storage, self.journal, s,
                                                     self.observer)
        long_lived()  # the store's client is made
        if manifests is not None:
            manifests = await self._known(manifests)
        tracked, self._unreconciled = await recovery.recover(
            self.streamer, self.journal, manifests
        )
        self._reached = manifests is not None
        done = {e.tag for e in await self.journal.entries("ready", "committed", "pruning",
                                                          "pruned", "conflict")}
        done |= writer.written_by(manifests or (), await self.streamer.writer())
        self._done = done
        if s.trainer or s.vllm or s.services:
            become_subreaper()
            self.supervisor = Supervisor(
                state_dir=s.run.state_dir, ack_dir=self.streamer.acks, vllm=s.vllm,
                services=s.services, trainer=s.trainer, resume_from=self._resume_point,
                on_change=self.observer.child_changed,
            )
            self.observer.supervisor = self.supervisor
        watcher = Watcher(
            s.checkpoints, s.run.output_dir, self._stage, self.streamer.complete, done, tracked,
            unmarked_settles=completion.unmarked_settles(node.rank, node.nodes),
            after_scan=self.space.check_safely,
        )
        self.streamer.on_rewritten = watcher.reopen
        return watcher

    async def _known(self, manifests: list[Manifest]) -> list[Manifest]:
        """What the store holds at start: shown, restored from on a fresh host (a job's
        fresh host is made whole by the hosts' agreement instead), and returned without
        the ones this run found corrupt."""
        self.observer.known(manifests)
        s = self.settings
        if self.joint is None and self._restore:
            await recovery.restore_if_fresh(
                self.storage, self.journal, manifests, s.run.output_dir, s.checkpoints
            )
        elif self.joint is None:
            log.info("restore_disabled", output_dir=str(s.run.output_dir),
                     hint="run.restore = false or traind run --no-restore")
        return await recovery.without_corrupt(self.journal, manifests)

    async def _stream(self) -> None:
        """The upload loop. When the trainer started without the store, the store is first
        waited for and what the previous daemon left is settled against it."""
        if not self._reached:
            manifests = await store_wait.wait_for_store(self.storage, _STREAMING_HINT, first=1)
            self._reached = True
            self.observer.known(manifests)
            manifests = await recovery.without_corrupt(self.journal, manifests)
            self._done |= writer.written_by(manifests, await self.streamer.writer())
            await recovery.reconcile(self.streamer, self.journal, manifests, self._unreconciled)
        await self.streamer.run()

    async def main_loop(
        self, tg: asyncio.TaskGroup, watcher: Watcher, stop: asyncio.Event,
        reload: asyncio.Event,
    ) -> Running:
        """Supervise, watch, stream and prune, each a task of ``tg``, until ``stop``; returns
        the tasks for ``shutdown`` to stop in order."""
        log.info("daemon_ready")
        background = [
            tg.create_task(self.pruning.run(), name="retention"),
            tg.create_task(each_time(reload, self.reload), name="reload"),
            tg.create_task(self.space.watch(lambda: self.settings.checkpoints.poll_interval),
                           name="space"),
        ]
        if self.supervisor is not None:
            background.append(tg.create_task(
                supervise(self.supervisor, self.settings, watcher, self.streamer, stop,
                          self._failed),
                name="supervisor"))
        if self.supervisor is not None or os.getpid() == 1:  # a subreaper, or init
            background.append(tg.create_task(reap_forever(), name="reaper"))
        stop_watching = asyncio.Event()
        running = Running(
            background,
            tg.create_task(watcher.run(stop_watching), name="watcher"),
            stop_watching,
            tg.create_task(self._stream(), name="streamer"),
        )
        await stop.wait()
        return running

    async def shutdown(self, watcher: Watcher, running: Running) -> None:
        """Stop in order (``shut_down``); what is not committed is in ``unstored``."""
        self.unstored = await shut_down(running, watcher, self.streamer, self.supervisor,
                                        self.observer, self.settings)

    async def close(self, failure: BaseException | None = None) -> None:
        """Let go of what the daemon holds (status server, store, journal, state_dir lock)
        however ``run`` ended, and say what is not in the store: after a ``failure`` (a task
        that crashed) as an error naming it, whatever is stored."""
        self.observer.notifier.stopping()
        if failure is not None and not self.unstored:  # no shutdown ran to count them
            self.unstored = self.streamer.unstored
        await self._serve_status(None)
        await self.storage.aclose()
        self._state.close()
        hint = ("not in the store: kept in state_dir and output_dir, and committed by the "
                "next traind run on this host")
        if failure is not None:
            log.error("daemon_stopped", unstored=self.unstored, error=_describe(failure),
                      hint=hint if self.unstored else "a task of the daemon failed")
        elif self.unstored:
            log.error("daemon_stopped", unstored=self.unstored, hint=hint)
        else:
            log.info("daemon_stopped", unstored=[])

    def _failed(self, status: int | None) -> None:
        self.failed_with = status

    async def _hand_on_left(self) -> None:
        """Before a trainer (re)start of a multi-node job: the watcher's last scan, so what
        the stopped trainer saved is staged (and its part stored) before the hosts agree."""
        if self.watcher is not None:
            await self.watcher.final_scan(writer_gone=True)

    async def _stage(self, tag: str, step: int, source: Path) -> StageResult:
        result = await self.streamer.stage(tag, step, source)
        if result is StageResult.STAGED and self.supervisor is not None:
            self.supervisor.notify_progress()
        return result

    async def _staged(self, nbytes: int) -> None:
        """Before the trainer hears a snapshot is taken: make room for its next save."""
        self.space.staged(nbytes)
        await self.space.check_safely()

    async def _resume_point(self) -> Path | None:
        s = self.settings
        if self.joint is not None:
            path = await self.joint.resume_point(self.storage, self.journal, s.run.output_dir,
                                                 self._done.add)
            self.pruning.resuming = () if path is None else (path.name,)
            return path
        path = await recovery.resume_point(
            self.storage, self.journal, s.run.output_dir, s.checkpoints
        )
        # Local retention must not delete it while the trainer loads it (or later).
        self.pruning.resuming = () if path is None else (path.name,)
        # One passed over as corrupt in the store is saved again by the trainer: store it
        # (the record goes once it is committed again).
        if self.watcher is not None:
            for tag, _ in await self.journal.corrupt():
                self.watcher.reopen(tag)
        return path

    async def _committed(self, manifest: Manifest) -> None:
        self.observer.committed(manifest)
        await self.journal.forget_corrupt(manifest.tag)  # stored anew over a corrupt one
        self.pruning.soon()
        await self.space.committed_safely(manifest.step)

    async def reload(self) -> None:
        """Re-read the config file; apply what can change live, report the rest. An invalid
        file changes nothing (see ``reconfigure``)."""
        if self.config_path is None:
            log.warning("reload_ignored", reason="daemon was not started from a config file")
            return
        self.settings = await reconfigure(self.config_path, self.settings, self.streamer,
                                          self.observer, self._use_storage) or self.settings

    def _use_storage(self, storage: CheckpointStore) -> None:
        self.storage = storage

    async def _serve_status(self, status: StatusConfig | None) -> None:
        await self.observer.serve(status, self.settings.run.state_dir)


def _describe(failure: BaseException) -> str:
    """What failed, in one line: the first failure inside a task group's exception group."""
    while isinstance(failure, BaseExceptionGroup) and failure.exceptions:
        failure = failure.exceptions[0]
    return f"{type(failure).__name__}: {failure}"


def _free(path: Path) -> float:
    """Free bytes on ``path``'s filesystem, NaN while it is not there (for the gauge)."""
    try:
        return float(free_bytes(path))
    except OSError:
        return float("nan")


def _streamer(settings: Settings, storage: CheckpointStore, journal: Journal, node: NodeRank,
              committed: Callable[[Manifest], Awaitable[None]],
              staged: Callable[[int], Awaitable[None]]) -> Streamer:
    """The run's streamer; on the Hub with ``coalesce``, commits coalesced to the steps
    retention keeps anyway."""
    coalesce = isinstance(settings.storage, HFStorage) and settings.storage.coalesce
    return Streamer(
        settings.run.name, settings.run.state_dir, storage, journal, committed,
        claim_ttl=settings.storage.claim_ttl,
        node=node,
        coalesce_every=(settings.retention.keep_every_steps or 0) if coalesce else None,
        on_staged=staged,
    )

"""The daemon: start-up, main loop, shutdown — in that order.

One TaskGroup owns every long-lived task; cancelling it is the shutdown. Signal handlers
only set events.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind import config
from traind.app.observe import Observer
from traind.app.prune import Pruning
from traind.app.reload import plan_reload
from traind.checkpoints.commit import writer
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake import completion
from traind.checkpoints.intake.watcher import StageResult, Watcher
from traind.checkpoints.multinode.resume import JointResume
from traind.checkpoints.restore import recovery
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.checkpoints.state.reserve import free_bytes
from traind.checkpoints.state.space import Pinned, SpaceGuard, open_journal
from traind.config import HFStorage, Settings, StatusConfig
from traind.errors import ConfigError, TraindError, TransientStorageError
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore, open_storage
from traind.status import locate
from traind.status.model import RecentErrors
from traind.status.server import StatusServer
from traind.supervisor.leftovers import stop_leftovers
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.reaper import REAP_INTERVAL, Reaper
from traind.supervisor.supervisor import Supervisor
from traind.util import priority
from traind.util.child import uninterrupted
from traind.util.retry import Backoff, retrying
from traind.util.units import parse_floor

RELEASE_TIMEOUT = 5.0
"""Seconds a stopping daemon spends marking its claims on unstored checkpoints stale."""
log = structlog.get_logger("traind.app")

_STORE_RETRY = (1.0, 60.0)
"""Waiting for a store that cannot be reached: the first pause and the cap, in seconds."""
_WAITING_HINT = ("waiting for the store before the trainer starts: output_dir holds no "
                 "checkpoint to resume from, and the store may hold a newer one")


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
        self.streamer = Streamer(
            settings.run.name, settings.run.state_dir, self.storage, self.journal,
            self._committed,
            claim_ttl=settings.storage.claim_ttl,
            node=self.node,
            coalesce_every=(settings.retention.keep_every_steps or 0
                            if isinstance(settings.storage, HFStorage)
                            and settings.storage.coalesce else None),
            on_staged=self._staged,
        )
        self.supervisor: Supervisor | None = None
        self.watcher: Watcher | None = None
        self.observer = Observer(
            settings.run.name,
            self.streamer,
            lambda: self.storage.describe,
            lambda: self.watcher.tracking if self.watcher else 0,
            recent,
            retention=lambda: self.settings.retention,
            prunes_remote=self.node.rank == 0,
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
        """With nodes > 1 and a trainer: the hosts' agreement on its resume point (a fresh
        host is made whole then, not restored at start-up)."""
        self.observer.joint = self.joint
        self._server: StatusServer | None = None
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
        log.info(
            "daemon_starting",
            run=s.run.name,
            run_key=self.journal.run.key,
            output_dir=str(s.run.output_dir),
            state_dir=str(s.run.state_dir),
            backend=self.storage.describe,
            nodes=node.nodes,
            node_rank=node.rank,
            node_rank_from=node.source,
            transfer_nice=priority.transfer_nice(),
        )
        await stop_leftovers(s.run.state_dir, [s.trainer, s.vllm, *s.services])
        for pinned in self._state.dropped:  # let go to open the journal at all
            await self.journal.set_state(pinned.tag, "dropped")
            self.observer.dropped(pinned)
        await self._check_space()  # a disk that filled before a restart: room first
        manifests = await self._first_manifests()
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
                state_dir=s.run.state_dir,
                ack_dir=self.streamer.acks,
                vllm=s.vllm,
                services=s.services,
                trainer=s.trainer,
                resume_from=self._resume_point,
                on_change=self.observer.child_changed,
            )
            self.observer.supervisor = self.supervisor
        watcher = Watcher(
            s.checkpoints, s.run.output_dir, self._stage, self.streamer.complete, done, tracked,
            unmarked_settles=completion.unmarked_settles(node.rank, node.nodes),
            after_scan=self._check_space,
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

    async def _first_manifests(self) -> list[Manifest] | None:
        """The store's manifests, or None when the store cannot be reached but the trainer
        can resume from output_dir without it (uploads catch up once the store answers).

        Otherwise a store that is down for now (network not up yet, server restarting) is
        waited for: on an empty output_dir the store may hold a newer checkpoint, and
        starting fresh would throw the run's progress away. A permanent error (bad
        credentials, no such bucket) ends the start-up."""
        try:
            return await self.storage.manifests()
        except TransientStorageError as exc:
            s = self.settings
            resume = await recovery.local_resume_point(
                self.journal, s.run.output_dir, s.checkpoints
            )
            if resume is not None:
                log.error("store_unreachable", backend=self.storage.describe, error=str(exc),
                          resume_from=str(resume),
                          hint="starting from the checkpoint in output_dir; uploads wait "
                               "for the store")
                return None
            log.error("store_unreachable", backend=self.storage.describe, error=str(exc),
                      retry_in=_STORE_RETRY[0], hint=_WAITING_HINT)
        self.observer.set_state("waiting_for_store")
        manifests = await self._wait_for_store(_WAITING_HINT, first=1)
        self.observer.set_state("starting")
        return manifests

    async def _wait_for_store(self, hint: str, first: int = 0) -> list[Manifest]:
        """The store's manifests, asked for with capped backoff until the store answers; a
        permanent error is raised. ``first`` counts the failures already reported."""
        failures = first

        def unreachable(exc: BaseException, n: int, delay: float) -> None:
            nonlocal failures
            failures = n
            log.error("store_unreachable", backend=self.storage.describe, error=str(exc),
                      retry_in=delay, hint=hint)

        manifests = await retrying(self.storage.manifests, Backoff(*_STORE_RETRY), None,
                                   on_retry=unreachable, failed=first)
        if failures:
            log.info("store_reachable", backend=self.storage.describe, failures=failures)
        return manifests

    async def _stream(self) -> None:
        """The upload loop. When the trainer started without the store, the store is first
        waited for and what the previous daemon left is settled against it."""
        if not self._reached:
            manifests = await self._wait_for_store(
                "the trainer runs meanwhile; checkpoints are snapshot and wait in staging",
                first=1,
            )
            self._reached = True
            self.observer.known(manifests)
            manifests = await recovery.without_corrupt(self.journal, manifests)
            self._done |= writer.written_by(manifests, await self.streamer.writer())
            await recovery.reconcile(self.streamer, self.journal, manifests, self._unreconciled)
        await self.streamer.run()

    async def main_loop(
        self, tg: asyncio.TaskGroup, watcher: Watcher, stop: asyncio.Event,
        reload: asyncio.Event,
    ) -> _Running:
        """Supervise, watch, stream and prune, each a task of ``tg``, until ``stop``; returns
        the tasks for ``shutdown`` to stop in order."""
        log.info("daemon_ready")
        background = [
            tg.create_task(self.pruning.run(), name="retention"),
            tg.create_task(self._reload_loop(reload), name="reload"),
            tg.create_task(self._space_loop(), name="space"),
        ]
        if self.supervisor is not None:
            background.append(tg.create_task(self._supervise(watcher, stop), name="supervisor"))
        if self.supervisor is not None or os.getpid() == 1:  # a subreaper, or init
            background.append(tg.create_task(self._reap_loop(), name="reaper"))
        stop_watching = asyncio.Event()
        running = _Running(
            background,
            tg.create_task(watcher.run(stop_watching), name="watcher"),
            stop_watching,
            tg.create_task(self._stream(), name="streamer"),
        )
        await stop.wait()
        return running

    async def shutdown(self, watcher: Watcher, running: _Running) -> None:
        """Stop in order: the children (trainer first), then, within ``stop_timeout``, a
        last scan that hands on every checkpoint the stopped trainer left complete,
        committed newest first. Without a trainer of its own the writer may still be
        saving: the watcher runs on until every candidate has settled (or the budget is
        spent) before that scan. What is not committed by then is in ``unstored`` (and in
        the journal for next time); its claims are released once the streamer stopped."""
        log.info("daemon_stopping")
        self.observer.notifier.stopping()
        self.observer.set_state("stopping")
        if self.supervisor is not None:
            await self.supervisor.stop()
        for task in running.background:
            task.cancel()
        writer_gone = self.supervisor is not None and self.supervisor.trainer is not None
        self.streamer.prefer_newest()
        deadline = asyncio.get_running_loop().time() + self.settings.run.stop_timeout
        if not writer_gone:
            await self._settle_at_stop(watcher, deadline)
        running.stop_watching.set()
        left: list[str] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await running.watching
                left = await watcher.final_scan(writer_gone)
                await self.streamer.wait_idle()
        running.streaming.cancel()
        left = list(dict.fromkeys([*left, *watcher.unsettled()]))
        self.unstored = [*self.streamer.unstored, *(t for t in left
                                                     if t not in self.streamer.unstored)]
        if self.unstored:  # the next host takes them over without waiting claim_ttl
            await asyncio.wait([running.streaming])  # its upload (and renewals) stopped first
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELEASE_TIMEOUT):
                    await self.streamer.release(self.unstored)

    async def _settle_at_stop(self, watcher: Watcher, deadline: float) -> None:
        """Keep watching until no candidate waits to settle, or until ``deadline``: the
        writer is not this daemon's child, so only its quiet says a save is done."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await watcher.scan()  # a save that ended just now is a candidate too
                if not (waiting := watcher.unsettled()):
                    return
                log.info("checkpoints_settling_at_stop", checkpoints=waiting,
                         settle=self.settings.checkpoints.settle,
                         budget=round(deadline - started, 3),
                         reason="no [trainer]: its writer may still be saving; each is "
                                "complete once quiet for settle")
                await watcher.settled()
        left = watcher.unsettled()
        (log.warning if left else log.info)(
            "checkpoints_settled_at_stop", waited=round(loop.time() - started, 3),
            unsettled=list(left),
        )

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

    async def _supervise(self, watcher: Watcher, stop: asyncio.Event) -> None:
        """Run the children; when training finished, commit what is left, then stop. When it
        failed for good, so too under ``exit_when_failed``, with the trainer's exit status."""
        assert self.supervisor is not None
        outcome = await self.supervisor.run()
        trainer = self.settings.trainer
        exits = trainer is not None and (
            trainer.exit_when_done if outcome == "finished" else trainer.exit_when_failed)
        if outcome != "finished":
            log.error(
                "supervision_ended",
                outcome=outcome,
                hint="traind exits once every checkpoint is committed" if exits else
                     "checkpoint streaming continues; see the child_* events",
            )
            if not exits:
                return
            self.failed_with = self.supervisor.failure_status()
        # The trainer is gone: every marked checkpoint it left is complete now, settled or
        # not. The scan is not cut short by a stop (no snapshot is left half taken).
        await uninterrupted(watcher.final_scan(writer_gone=True))
        if self.streamer.pending:
            log.info("run_waiting_for_uploads", checkpoints=self.streamer.pending,
                     hint="the daemon exits once every checkpoint is committed")
        await self.streamer.wait_idle()
        if outcome == "finished":
            log.info("run_complete", exit=exits)
        if exits:
            stop.set()

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
        await self._check_space()

    async def _space_loop(self) -> None:
        """Check free space on output_dir's filesystem every ``poll_interval`` too: the
        trainer writes between snapshots."""
        while True:
            await asyncio.sleep(self.settings.checkpoints.poll_interval)
            await self._check_space()

    async def _reap_loop(self) -> None:
        """Wait for the orphans this daemon adopted, as PID 1 or subreaper, once they exit:
        nothing else would, and each would stay a zombie."""
        reaper = Reaper()
        while True:
            await asyncio.sleep(REAP_INTERVAL)
            for pid, code in (await asyncio.to_thread(reaper.sweep)).items():
                log.info("orphan_reaped", pid=pid, returncode=code)

    async def _check_space(self) -> None:
        """One free-space check; a failed one must never stop the daemon or a snapshot."""
        try:
            await self.space.check()
        except (OSError, TraindError) as exc:
            log.error("space_check_failed", error=str(exc))

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
        try:  # on a full disk: the older ones still to commit are let go
            await self.space.committed(manifest.step)
        except (OSError, TraindError) as exc:
            log.error("space_check_failed", error=str(exc))

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
        self.streamer.claim_ttl = self.settings.storage.claim_ttl
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
        state_dir = self.settings.run.state_dir
        if self._server is not None:
            await self._server.stop()
            self._server = None
            locate.withdraw(state_dir)
        if status is not None and status.enabled:
            server = StatusServer(status.listen, self.observer.snapshot, self.observer.metrics)
            await server.start()
            self._server = server
            try:  # how `traind status` finds this daemon when the config file is broken
                locate.publish(state_dir, str(server.address))
            except OSError as exc:
                log.warning("status_address_unpublished", state_dir=str(state_dir),
                            error=str(exc))


@dataclass(frozen=True)
class StateDir:
    """What a daemon holds of run.state_dir while it runs: the lock that keeps a second
    daemon off it, the run's journal, and the snapshots let go to open that journal at all
    (a full disk; the daemon journals them as dropped)."""

    lock: int | None
    journal: Journal
    dropped: list[Pinned]

    @classmethod
    def open(cls, state_dir: Path, run: RunIdentity) -> StateDir:
        """Make ``state_dir``, lock it (TraindError when another daemon holds it) and open
        ``run``'s journal in it. Blocking."""
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = _lock_state_dir(state_dir)
        try:
            journal, dropped = open_journal(state_dir, run)
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise
        return cls(lock, journal, dropped)

    def close(self) -> None:
        """Close the journal, then let go of the lock."""
        self.journal.close()
        if self.lock is not None:
            os.close(self.lock)


@dataclass(frozen=True)
class _Running:
    """The main loop's tasks, in the order ``shutdown`` stops them."""

    background: list[asyncio.Task[None]]
    watching: asyncio.Task[None]
    stop_watching: asyncio.Event
    streaming: asyncio.Task[None]


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
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as exc:  # a full disk: the lock holds all the same, only unnamed
        log.warning("state_dir_lock_pid_unwritten", state_dir=str(state_dir), error=str(exc))
    return fd


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

"""Running the children: one loop per child (start → ready → watch → stop → back off →
restart, or FATAL) and the Supervisor that orders them: services, vLLM once ready, trainer.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from yarl import URL

from traind.config import ChildConfig, HealthConfig, ServiceConfig, TrainerConfig, VLLMConfig
from traind.errors import SupervisorError
from traind.supervisor.health import HealthCheck, close_communicator
from traind.supervisor.policy import Action, History, Role, decide, is_failure
from traind.supervisor.process import (
    ManagedProcess,
    State,
    gpu_memory_used,
    uninterrupted,
    wait_gpus_idle,
    wait_port_free,
)

log = structlog.get_logger("traind.supervisor")

ResumeFrom = Callable[[], Awaitable[Path | None]]
RESUME = "{resume_from}"
Jitter = Callable[[], float]


def resume_argv(command: Sequence[str], checkpoint: Path | None) -> tuple[str, ...]:
    """The trainer's argv with ``{resume_from}`` filled in.

    With a checkpoint, every ``{resume_from}`` becomes its path. Without one, every argument
    containing it is dropped, and a bare ``{resume_from}`` also takes the option before it
    (an argument starting with ``-`` without ``=``): ``--resume_from_checkpoint {resume_from}``
    vanishes as a pair, ``--resume={resume_from}`` alone.
    """
    if checkpoint is not None:
        return tuple(arg.replace(RESUME, str(checkpoint)) for arg in command)
    out: list[str] = []
    for arg in command:
        if RESUME not in arg:
            out.append(arg)
        elif arg == RESUME and len(out) > 1 and out[-1].startswith("-") and "=" not in out[-1]:
            out.pop()
    return tuple(out)


@dataclass(frozen=True)
class Launch:
    """What one start runs: the argv and environment additions."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ChildStatus:
    """A child's state for the status page."""

    name: str
    role: str
    state: str
    pid: int | None
    starts: int
    restarts: int
    returncode: int | None
    since: float
    outcome: str | None


async def _forever() -> str:
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")


async def _first(*coros: Coroutine[Any, Any, str]) -> str:
    """The result of the first coroutine to finish (earlier ones win ties); the rest are
    cancelled and awaited."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(t for t in tasks if t.done()).result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ChildRunner:
    """Supervises one child: start, wait until healthy (RUNNING), watch exit and health, stop,
    back off per policy and restart; ends EXITED (done) or FATAL (gave up)."""

    def __init__(
        self,
        name: str,
        config: ChildConfig,
        role: Role,
        *,
        log_dir: Path,
        health: HealthConfig | None = None,
        base_env: Mapping[str, str] | None = None,
        on_change: Callable[[ChildRunner], None] | None = None,
        jitter: Jitter = random.random,
    ) -> None:
        self.name = name
        self.config = config
        self.role = role
        self.process = ManagedProcess(name, config, role, log_dir=log_dir, base_env=base_env,
                                      on_state=self._state_changed)
        self.starts = 0
        self.restarts = 0
        self.outcome: str | None = None
        """Set when run() ends: finished, failed, fatal or stopped."""
        self.since = time.time()
        self._health = HealthCheck(health, name) if health is not None else None
        self._history = History()
        self._jitter = jitter
        self._restart = asyncio.Event()
        self._changed = asyncio.Event()
        self._on_change = on_change
        self._log = log.bind(child=name)

    @property
    def state(self) -> State:
        """The child's current state."""
        return self.process.state

    @property
    def ended(self) -> bool:
        """True once run() has returned: the child will not be started again."""
        return self.outcome is not None

    def status(self) -> ChildStatus:
        """A snapshot for the status page."""
        p = self.process
        pid = p.pid if p.running else None
        return ChildStatus(self.name, self.role.value, self.state.value, pid, self.starts,
                           self.restarts, p.returncode, self.since, self.outcome)

    def request_restart(self, reason: str) -> None:
        """Stop the running child and start it again at once, outside the restart policy."""
        if self.process.running and not self._restart.is_set():
            self._log.info("child_restart_requested", reason=reason, pid=self.process.pid)
            self._restart.set()

    async def wait_ready(self, after_starts: int = 0) -> None:
        """Wait until RUNNING after more than ``after_starts`` starts; SupervisorError if the
        child ended for good meanwhile."""
        while not (self.state is State.RUNNING and self.starts > after_starts):
            if self.ended:
                raise SupervisorError(f"{self.name} ended ({self.outcome})")
            changed = self._changed
            await changed.wait()

    async def run(self) -> str:
        """Supervise until the child is done or given up; when cancelled, stop the child (its
        grace period still applies) and re-raise. Returns the outcome."""
        try:
            self.outcome = await self._loop()
        finally:
            await self.process.stop()
            if self.outcome is None:
                self.outcome = "stopped"
                self.process.set_state(State.EXITED)
            self._notify()
        return self.outcome

    async def before_start(self, first: bool) -> Launch:
        """Prepare a start (the first one when ``first``); subclasses wait for resources.
        A SupervisorError counts as a failed start."""
        return Launch(self.config.command)

    async def monitor(self) -> str:
        """Watch the running child; return a reason to stop it (subclasses detect hangs)."""
        return await _forever()

    # -- internals --

    async def _loop(self) -> str:
        while True:
            self.process.set_state(State.STARTING)
            try:
                launch = await self.before_start(first=self.starts == 0)
            except SupervisorError as exc:
                self._log.error("child_start_failed", error=str(exc))
                reason, code, uptime = "start_failed", None, 0.0
            else:
                self._restart.clear()
                reason, code, uptime = await self._run_once(launch)
            if reason == "restart_requested":
                continue
            failed = reason != "exited" or is_failure(self.role, code)
            d = decide(self.config.restart, self._history, now=time.monotonic(), uptime=uptime,
                       failed=failed, jitter=self._jitter)
            self._history = d.history
            facts = {"reason": reason, "returncode": code, "uptime": round(uptime, 3),
                     "decision": d.reason, "restarts_in_window": len(d.history.restarts)}
            if d.action is Action.RESTART:
                self.process.set_state(State.BACKOFF)
                self._log.warning("child_backoff", delay=round(d.delay, 3), **facts)
                await asyncio.sleep(d.delay)
                self.restarts += 1
            elif d.action is Action.FATAL:
                self.process.set_state(State.FATAL)
                self._log.error("child_fatal", **facts)
                return "fatal"
            else:
                self.process.set_state(State.EXITED)
                self._log.info("child_done", **facts)
                return "failed" if failed else "finished"

    async def _run_once(self, launch: Launch) -> tuple[str, int | None, float]:
        try:
            await self.process.start(launch.argv, launch.env)
        except SupervisorError:
            return "start_failed", None, 0.0
        self.starts += 1
        try:
            reason = await _first(self._exited(), self._liveness(), self.monitor(),
                                  self._restart_wanted())
        finally:
            await self.process.stop()
        if reason != "exited":
            self._log.warning("child_stopped", reason=reason, pid=self.process.pid)
        return reason, self.process.returncode, self.process.uptime

    async def _exited(self) -> str:
        await self.process.wait()
        return "exited"

    async def _restart_wanted(self) -> str:
        await self._restart.wait()
        return "restart_requested"

    async def _liveness(self) -> str:
        if self._health is None:
            self.process.set_state(State.RUNNING)
            return await _forever()
        try:
            await self._health.wait_ready()
        except SupervisorError:
            return "not_ready"
        if self.process.running:
            self.process.set_state(State.RUNNING)
        await self._health.watch()
        return "unhealthy"

    def _state_changed(self, name: str, state: State) -> None:
        self.since = time.time()
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if self._on_change is not None:
            self._on_change(self)


class VLLMRunner(ChildRunner):
    """The vLLM server: restarted only once its port and GPUs are free again, and reset for a
    restarted trainer (close the weight-sync group, or restart)."""

    def __init__(self, config: VLLMConfig, *, log_dir: Path, **kw: Any) -> None:
        super().__init__("vllm", config, Role.VLLM, log_dir=log_dir, health=config.health, **kw)
        self.vllm = config
        self._idle: dict[int, int] | None = None

    async def before_start(self, first: bool) -> Launch:
        """Record the GPUs' idle memory first; later wait until the last server let go."""
        gpus = self.vllm.gpus or ()
        if first and gpus:
            self._idle = await asyncio.to_thread(gpu_memory_used, gpus)
        url = URL(self.vllm.health.url)
        if url.port is not None:
            await wait_port_free(url.port, self.vllm.release_timeout)
        if not first:
            await wait_gpus_idle(gpus, self._idle, self.vllm.release_timeout)
        return Launch(self.vllm.command)

    async def reset_weight_sync(self, generation: int) -> None:
        """Get vLLM ready for a restarted trainer that first met it at start ``generation``."""
        mode = self.vllm.on_trainer_restart
        if mode == "nothing" or self.starts != generation:
            return  # restarted since: no stale weight-sync group
        if mode == "close-communicator":
            if await close_communicator(self.vllm.health.url, self.vllm.health.timeout):
                return
            self._log.warning("vllm_reset_fallback_restart")
        self.request_restart("trainer_restarted")
        await self.wait_ready(after_starts=generation)


def _clear_heartbeat(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


def _read_heartbeat(path: Path, seen: tuple[int, int] | None) -> tuple[tuple[int, int], str] | None:
    """(identity, phase) of the heartbeat file when it changed since ``seen``, else None."""
    try:
        st = path.stat()
        key = (st.st_ino, st.st_mtime_ns)
        if key == seen:
            return None
        phase = json.loads(path.read_text()).get("phase", "training")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        phase = "training"
    return key, str(phase)


class TrainerRunner(ChildRunner):
    """The trainer: starts once its dependencies are ready, resumes from the newest committed
    checkpoint, and is stopped as hung when it makes no progress."""

    def __init__(
        self,
        config: TrainerConfig,
        *,
        log_dir: Path,
        heartbeat: Path,
        resume_from: ResumeFrom | None = None,
        needs: Sequence[ChildRunner] = (),
        vllm: VLLMRunner | None = None,
        **kw: Any,
    ) -> None:
        super().__init__("trainer", config, Role.TRAINER, log_dir=log_dir, **kw)
        self.trainer = config
        self.heartbeat = heartbeat
        self._resume_from = resume_from
        self._needs = needs
        self._vllm = vllm
        self._vllm_generation = 0
        self._progress = 0.0
        self._stepping = False
        self._slow_phase = False

    def notify_progress(self) -> None:
        """Count as progress now (the daemon calls this when checkpoints appear or commit)."""
        self._progress = time.monotonic()
        self._stepping = True

    async def before_start(self, first: bool) -> Launch:
        """Wait for services and vLLM, reset vLLM after a trainer death, find the checkpoint."""
        for dep in self._needs:
            await dep.wait_ready()
        if self._vllm is not None:
            if not first:
                await self._vllm.reset_weight_sync(self._vllm_generation)
            self._vllm_generation = self._vllm.starts
        checkpoint = await self._checkpoint()
        await asyncio.to_thread(_clear_heartbeat, self.heartbeat)
        env = {"TRAIND_HEARTBEAT": str(self.heartbeat)}
        if checkpoint is not None:
            env["TRAIND_RESUME_FROM"] = str(checkpoint)
        self._log.info("trainer_launch", resume_from=str(checkpoint) if checkpoint else None,
                       first=first)
        self._progress = time.monotonic()
        self._stepping = self._slow_phase = False
        return Launch(resume_argv(self.config.command, checkpoint), env)

    async def _checkpoint(self) -> Path | None:
        if self._resume_from is None:
            return None
        try:
            return await self._resume_from()
        except Exception as exc:  # the daemon's callable: any failure is a failed start
            raise SupervisorError(f"cannot find the checkpoint to resume from: {exc}") from exc

    async def monitor(self) -> str:
        """Return "hung" after ``progress_timeout`` without progress (heartbeat, output,
        notify_progress); until the first heartbeat or checkpoint, and while the heartbeat
        says "saving" or "done", the longer ``first_progress_timeout`` applies."""
        c = self.trainer
        limits = [t for t in (c.progress_timeout, c.first_progress_timeout) if t]
        if not limits:
            return await _forever()
        tick = min(1.0, max(0.02, min(limits) / 10))
        seen: tuple[int, int] | None = None
        while True:
            await asyncio.sleep(tick)
            beat = await asyncio.to_thread(_read_heartbeat, self.heartbeat, seen)
            if beat is not None:
                seen, phase = beat
                self.notify_progress()
                self._slow_phase = phase in ("saving", "done")
            slow = self._slow_phase or not self._stepping
            limit = c.first_progress_timeout if slow else c.progress_timeout
            idle = time.monotonic() - max(self._progress, self.process.last_output)
            if limit is not None and idle > limit:
                self._log.error("trainer_hung", pid=self.process.pid, idle=round(idle, 3),
                                limit=limit, loading=not self._stepping)
                return "hung"


class Supervisor:
    """Starts services, then vLLM once ready, then the trainer; restarts what fails (the
    trainer too when vLLM restarts under it); stops the trainer first, services last."""

    def __init__(
        self,
        *,
        state_dir: Path,
        vllm: VLLMConfig | None = None,
        services: Sequence[ServiceConfig] = (),
        trainer: TrainerConfig | None = None,
        resume_from: ResumeFrom | None = None,
        base_env: Mapping[str, str] | None = None,
        on_change: Callable[[ChildStatus], None] | None = None,
        jitter: Jitter = random.random,
    ) -> None:
        kw: dict[str, Any] = {"log_dir": state_dir / "logs", "base_env": base_env,
                              "on_change": self._changed_child, "jitter": jitter}
        self.services = [ChildRunner(s.name, s, Role.SERVICE, health=s.health, **kw)
                         for s in services]
        self.vllm = VLLMRunner(vllm, **kw) if vllm is not None else None
        needs = [*self.services, *([self.vllm] if self.vllm else [])]
        self.trainer = (
            TrainerRunner(trainer, heartbeat=state_dir / "trainer.heartbeat",
                          resume_from=resume_from, needs=needs, vllm=self.vllm, **kw)
            if trainer is not None else None
        )
        self.finished = asyncio.Event()
        """Set when the trainer exited 0 (training finished) and will not be restarted."""
        self.outcome: str | None = None
        """After run(): finished, failed (a child ended for good) or stopped."""
        self._on_change = on_change
        self._stop = asyncio.Event()
        self._stopped = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[str]] = {}
        self._vllm_up = False
        self._running = False

    @property
    def runners(self) -> list[ChildRunner]:
        """Every child in start order."""
        tail = [r for r in (self.vllm, self.trainer) if r is not None]
        return [*self.services, *tail]

    def status(self) -> list[ChildStatus]:
        """Every child's state, in start order."""
        return [r.status() for r in self.runners]

    def notify_progress(self) -> None:
        """Tell hang detection the trainer made progress (a checkpoint appeared or committed)."""
        if self.trainer is not None:
            self.trainer.notify_progress()

    async def run(self) -> str:
        """Start everything in order and supervise until the trainer finished, a child ended
        for good, or stop(); all children are stopped before it returns the outcome. On
        cancellation it stops them in order too, then re-raises."""
        self._running = True
        log.info("supervisor_starting", children=[r.name for r in self.runners])
        try:
            await self._start_in_order()
            await self._until(lambda: False)
        finally:
            await uninterrupted(self._stop_all())
        assert self.outcome is not None
        return self.outcome

    async def stop(self) -> None:
        """Stop the trainer, then vLLM, then services, each within its grace period."""
        self._stop.set()
        self._notify()
        if self._running:
            await self._stopped.wait()

    async def _start_in_order(self) -> None:
        for r in self.services:
            self._spawn(r)
        if not await self._until(lambda: all(r.state is State.RUNNING for r in self.services)):
            return
        if self.vllm is not None:
            self._spawn(self.vllm)
            vllm = self.vllm
            if not await self._until(lambda: vllm.state is State.RUNNING):
                return
        if self.trainer is not None:
            self._spawn(self.trainer)

    def _spawn(self, runner: ChildRunner) -> None:
        self._tasks[runner.name] = asyncio.create_task(runner.run(), name=f"child-{runner.name}")

    def _over(self) -> bool:
        return self._stop.is_set() or any(r.ended for r in self.runners)

    async def _until(self, ready: Callable[[], bool]) -> bool:
        while not ready():
            if self._over():
                return False
            changed = self._changed
            await changed.wait()
        return True

    async def _stop_all(self) -> None:
        log.info("supervisor_stopping", requested=self._stop.is_set())
        for runner in reversed(self.runners):
            task = self._tasks.get(runner.name)
            if task is None:
                continue
            task.cancel()
            (result,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(result, Exception):
                log.error("child_runner_crashed", child=runner.name, error=repr(result))
        self.outcome = self._decide_outcome()
        log.info("supervisor_stopped", outcome=self.outcome)
        self._stopped.set()

    def _decide_outcome(self) -> str:
        if self.trainer is not None and self.trainer.outcome == "finished":
            return "finished"
        if any(r.outcome in ("failed", "fatal") for r in self.runners):
            return "failed"
        return "stopped"

    def _changed_child(self, runner: ChildRunner) -> None:
        if runner is self.vllm:
            self._vllm_restarted(runner.state)
        if runner is self.trainer and runner.outcome == "finished" and not self.finished.is_set():
            log.info("run_finished")
            self.finished.set()
        self._notify()
        if self._on_change is not None:
            self._on_change(runner.status())

    def _vllm_restarted(self, state: State) -> None:
        if state is State.RUNNING:
            self._vllm_up = True
        elif self._vllm_up:
            self._vllm_up = False
            if self.trainer is not None and not self._stop.is_set():
                self.trainer.request_restart("vllm_restarted")

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

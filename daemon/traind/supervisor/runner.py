"""Running one child: start → ready → watch → stop → back off → restart, or FATAL.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from traind.config import ChildConfig, HealthConfig
from traind.errors import SupervisorError
from traind.supervisor.health import HealthCheck, HealthRedirectError
from traind.supervisor.policy import History, RestartAction, Role, decide, is_failure
from traind.supervisor.process import ManagedProcess, State

log = structlog.get_logger("traind.supervisor")

Jitter = Callable[[], float]


@dataclass(frozen=True)
class StartSpec:
    """What one start runs: the argv, environment additions, and the facts its
    ``child_started`` event carries (e.g. the trainer's ``resume_from``)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    facts: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ChildStatus:
    """A child's state for the status page; ``returncode`` is its last exit code, kept
    while a restart runs (None before its first exit)."""

    name: str
    role: str
    state: str
    pid: int | None
    starts: int
    restarts: int
    returncode: int | None
    since: float
    outcome: str | None


async def forever() -> str:
    """Never return (until cancelled): a watch with nothing to watch."""
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
        owner: str | None = None,
        on_change: Callable[[ChildRunner], None] | None = None,
        jitter: Jitter = random.random,
    ) -> None:
        self.name = name
        self.config = config
        self.role = role
        self.process = ManagedProcess(name, config, role, log_dir=log_dir, base_env=base_env,
                                      owner=owner, on_state=self._state_changed)
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
                           self.restarts, p.last_exit, self.since, self.outcome)

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

    async def before_start(self, first: bool) -> StartSpec:
        """Prepare a start (the first one when ``first``); subclasses wait for resources.
        A SupervisorError counts as a failed start."""
        return StartSpec(self.config.command)

    async def monitor(self) -> str:
        """Watch the running child; return a reason to stop it (subclasses detect hangs)."""
        return await forever()

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
            if reason == "misconfigured":
                self.process.set_state(State.FATAL)
                self._log.error("child_fatal", reason=reason, returncode=code)
                return "fatal"
            failed = reason != "exited" or is_failure(self.role, code)
            d = decide(self.config.restart, self._history, now=time.monotonic(), uptime=uptime,
                       failed=failed, jitter=self._jitter)
            self._history = d.history
            facts = {"reason": reason, "returncode": code, "uptime": round(uptime, 3),
                     "decision": d.reason, "restarts_in_window": len(d.history.restarts)}
            if d.action is RestartAction.RESTART:
                self.process.set_state(State.BACKOFF)
                # A failure is an error (it shows in `traind status`); a planned restart is not.
                (self._log.error if failed else self._log.warning)(
                    "child_backoff", delay=round(d.delay, 3), **facts
                )
                await asyncio.sleep(d.delay)
                self.restarts += 1
            elif d.action is RestartAction.FATAL:
                self.process.set_state(State.FATAL)
                self._log.error("child_fatal", **facts)
                return "fatal"
            else:
                self.process.set_state(State.EXITED)
                (self._log.error if failed else self._log.info)("child_done", **facts)
                return "failed" if failed else "finished"

    async def _run_once(self, launch: StartSpec) -> tuple[str, int | None, float]:
        try:
            await self.process.start(launch.argv, launch.env, launch.facts)
        except SupervisorError:
            return "start_failed", None, 0.0
        self.starts += 1
        try:
            reason = await _first(self._exited(), self._liveness(), self.monitor(),
                                  self._restart_wanted(), self.process.track())
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
            return await forever()
        try:
            await self._health.wait_ready()
        except HealthRedirectError:
            return "misconfigured"  # restarting cannot fix a wrong health URL
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

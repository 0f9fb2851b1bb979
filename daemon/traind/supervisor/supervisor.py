"""The Supervisor: orders the children (services, vLLM once ready, trainer), restarts the
trainer when vLLM restarts under it, and stops them in reverse order.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from traind.config import ServiceConfig, TrainerConfig, VLLMConfig
from traind.supervisor.env import owner_of
from traind.supervisor.policy import Role
from traind.supervisor.process import State
from traind.supervisor.runner import ChildRunner, ChildStatus, Jitter
from traind.supervisor.trainer import ResumeFrom, TrainerRunner
from traind.supervisor.vllm import VLLMRunner
from traind.util.proc.child import uninterrupted

log = structlog.get_logger("traind.supervisor")


class Supervisor:
    """Starts services, then vLLM once ready, then the trainer; restarts what fails (the
    trainer too when vLLM restarts under it); stops the trainer first, services last."""

    def __init__(
        self,
        *,
        state_dir: Path,
        ack_dir: Path | None = None,
        vllm: VLLMConfig | None = None,
        services: Sequence[ServiceConfig] = (),
        trainer: TrainerConfig | None = None,
        resume_from: ResumeFrom | None = None,
        base_env: Mapping[str, str] | None = None,
        on_change: Callable[[ChildStatus], None] | None = None,
        jitter: Jitter = random.random,
    ) -> None:
        kw: dict[str, Any] = {"log_dir": state_dir / "logs", "base_env": base_env,
                              "owner": owner_of(state_dir), "on_change": self._changed_child,
                              "jitter": jitter}
        self.services = [ChildRunner(s.name, s, Role.SERVICE, health=s.health, **kw)
                         for s in services]
        self.vllm = VLLMRunner(vllm, **kw) if vllm is not None else None
        needs = [*self.services, *([self.vllm] if self.vllm else [])]
        self.trainer = (
            TrainerRunner(trainer, heartbeat=state_dir / "trainer.heartbeat",
                          ack_dir=ack_dir or state_dir / "acks",
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
        self._group: asyncio.TaskGroup | None = None
        """Owns every child's runner task while ``run`` runs."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
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
        async with asyncio.TaskGroup() as group:
            self._group = group
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
        assert self._group is not None
        self._tasks[runner.name] = self._group.create_task(
            self._supervised(runner), name=f"child-{runner.name}"
        )

    async def _supervised(self, runner: ChildRunner) -> None:
        """Run one child. A crash of its runner is logged and ends it (``run`` then stops the
        others in order) instead of making the task group cancel them all at once."""
        try:
            await runner.run()
        except Exception as exc:
            log.error("child_runner_crashed", child=runner.name, error=repr(exc))

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
            await asyncio.wait([task])
        self.outcome = self._decide_outcome()
        log.info("supervisor_stopped", outcome=self.outcome)
        self._stopped.set()

    def failure_status(self) -> int:
        """The exit status that passes a failed run on: the trainer's own when it failed (a
        signal N as 128 + N, as a shell says it), else 1 (another child ended the run)."""
        trainer = self.trainer
        code = trainer.process.last_exit if trainer is not None else None
        if trainer is None or trainer.outcome not in ("failed", "fatal") or not code:
            return 1
        return 128 - code if code < 0 else code

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

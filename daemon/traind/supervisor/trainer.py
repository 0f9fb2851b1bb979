"""The trainer's runner: waits for its dependencies, resumes from the newest checkpoint and
detects hangs from its heartbeat file and output.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from traind.config import TrainerConfig
from traind.errors import SupervisorError
from traind.layout.markers import ACK_DIR_ENV
from traind.supervisor.policy import Role
from traind.supervisor.runner import ChildRunner, StartSpec, forever
from traind.supervisor.vllm import VLLMRunner

ResumeFrom = Callable[[], Awaitable[Path | None]]
RESUME = "{resume_from}"


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
        ack_dir: Path,
        resume_from: ResumeFrom | None = None,
        needs: Sequence[ChildRunner] = (),
        vllm: VLLMRunner | None = None,
        **kw: Any,
    ) -> None:
        super().__init__("trainer", config, Role.TRAINER, log_dir=log_dir, **kw)
        self.trainer = config
        self.heartbeat = heartbeat
        self.ack_dir = ack_dir
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

    async def before_start(self, first: bool) -> StartSpec:
        """Wait for services and vLLM, reset vLLM after a trainer death, find the checkpoint."""
        for dep in self._needs:
            await dep.wait_ready()
        if self._vllm is not None:
            if not first:
                await self._vllm.reset_weight_sync(self._vllm_generation)
            self._vllm_generation = self._vllm.starts
        checkpoint = await self._checkpoint()
        await asyncio.to_thread(_clear_heartbeat, self.heartbeat)
        env = {"TRAIND_HEARTBEAT": str(self.heartbeat), ACK_DIR_ENV: str(self.ack_dir)}
        if checkpoint is not None:
            env["TRAIND_RESUME_FROM"] = str(checkpoint)
        self._progress = time.monotonic()
        self._stepping = self._slow_phase = False
        resume = {"resume_from": str(checkpoint) if checkpoint else None}
        return StartSpec(resume_argv(self.config.command, checkpoint), env, resume)

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
            return await forever()
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

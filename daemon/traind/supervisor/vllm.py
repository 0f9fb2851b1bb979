"""The vLLM server's runner: restarted only once its port and GPUs are free again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from yarl import URL

from traind.config import VLLMConfig
from traind.supervisor.health import close_communicator
from traind.supervisor.policy import Role
from traind.supervisor.resources import gpu_memory_used, wait_gpus_idle, wait_port_free
from traind.supervisor.runner import ChildRunner, Launch


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

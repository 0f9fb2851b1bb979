"""The vLLM server's runner: restarted only once its port and GPUs are free again, restarted
when it stalls behind a 200 /health, and reset for a restarted trainer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from yarl import URL

from traind.config import VLLMConfig
from traind.errors import SupervisorError
from traind.supervisor.health import base_url, close_communicator, fetch_text, server_kind
from traind.supervisor.policy import Role
from traind.supervisor.resources import gpu_memory_used, wait_gpus_idle, wait_port_free
from traind.supervisor.runner import ChildRunner, StartSpec, forever
from traind.supervisor.stall import Stall, is_hung, observe, parse_load


class VLLMRunner(ChildRunner):
    """The vLLM server: restarted only once its port and GPUs are free again, stopped as hung
    when busy without generating, and reset for a restarted trainer (restart, or the old TRL
    server's close-communicator)."""

    def __init__(self, config: VLLMConfig, *, log_dir: Path, **kw: Any) -> None:
        super().__init__("vllm", config, Role.VLLM, log_dir=log_dir, health=config.health, **kw)
        self.vllm = config
        self._idle: dict[int, int] | None = None

    async def before_start(self, first: bool) -> StartSpec:
        """Record the GPUs' idle memory first; later wait until the last server let go. A port
        still held after ``release_timeout`` is a failed start: a second vLLM would share it."""
        gpus = self.vllm.gpus or ()
        if first and gpus:
            self._idle = await asyncio.to_thread(gpu_memory_used, gpus)
        url = URL(self.vllm.health.url)
        if url.port is not None:
            use = await wait_port_free(url.port, self.vllm.release_timeout)
            if use.busy:
                raise SupervisorError(f"port {url.port} is still held by {use.describe()} "
                                      f"after {self.vllm.release_timeout}s")
        if not first:
            await wait_gpus_idle(gpus, self._idle, self.vllm.release_timeout)
        return StartSpec(self.vllm.command)

    async def monitor(self) -> str:
        """Return "hung" once the server, ready and busy (requests running or waiting), has
        generated no token for ``stall_timeout``, read from its /metrics every ``interval``.
        Idle servers are never hung; a server without vLLM's metrics is not watched."""
        h = self.vllm.health
        if h.stall_timeout is None:
            return await forever()
        await self.wait_ready(after_starts=self.starts - 1)
        loop = asyncio.get_running_loop()
        url = base_url(h.url) / "metrics"
        stall: Stall | None = None
        while True:
            await asyncio.sleep(h.interval)
            got = await fetch_text(url, h.timeout)
            load = parse_load(got[1]) if got is not None and got[0] == 200 else None
            if load is None:
                continue  # no answer this time: /health decides whether it is dead
            stall = observe(stall, load, loop.time())
            if is_hung(stall, loop.time(), h.stall_timeout):
                self._log.error("vllm_hung", pid=self.process.pid, running=load.running,
                                waiting=load.waiting, generated=load.generated,
                                limit=h.stall_timeout)
                return "hung"

    async def reset_weight_sync(self, generation: int) -> None:
        """Get vLLM ready for a restarted trainer that first met it at start ``generation``,
        and return once it is ready again.

        vLLM's NCCL weight-transfer engine replaces its group on every
        ``/init_weight_transfer_engine``, but a worker left inside ``/update_weights`` by a
        trainer that died mid-broadcast waits on NCCL forever while /health says 200; traind
        cannot see which, so "auto" restarts vLLM's own server. The older ``trl vllm-serve``
        server refuses a second ``init_communicator`` until ``/close_communicator/``.
        """
        mode = self.vllm.on_trainer_restart
        if mode == "nothing" or self.starts != generation:
            return  # restarted since: no stale weight-sync group
        h = self.vllm.health
        if mode == "auto":
            kind = await server_kind(h.url, h.timeout)
            mode = "close-communicator" if kind == "trl" else "restart"
            self._log.info("vllm_trainer_restart_reset", server=kind, action=mode)
        if mode == "close-communicator":
            if await close_communicator(h.url, h.timeout):
                return
            self._log.warning("vllm_reset_fallback_restart")
        self.request_restart("trainer_restarted")
        await self.wait_ready(after_starts=generation)

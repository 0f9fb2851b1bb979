"""Resources a restarted vLLM needs back: its TCP port and its GPUs' memory."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from traind.supervisor.ports import PortUse, port_use
from traind.util.poll import poll_until

log = structlog.get_logger("traind.supervisor")
IDLE_SLACK = 512 * 1024**2


async def wait_port_free(port: int, limit: float) -> PortUse:
    """Wait up to ``limit`` seconds until nothing holds TCP ``port`` (listening, or bound as
    a loading vLLM holds it); return what holds it last. One ``port_busy`` event names the
    holders when it is busy at first, ``port_still_busy`` when it stayed busy."""
    use = await asyncio.to_thread(port_use, port)
    if not use.busy:
        return use
    log.info("port_busy", port=port, holders=use.describe(), waiting=limit)
    use = await poll_until(lambda: asyncio.to_thread(port_use, port),
                           done=lambda u: not u.busy, within=limit, every=0.2)
    if use.busy:
        log.warning("port_still_busy", port=port, waited=limit, holders=use.describe())
    return use


def gpu_memory_used(gpus: Sequence[int]) -> dict[int, int] | None:
    """Used memory in bytes per GPU index (NVML order = PCI bus order), or None without NVML."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
        try:
            return {
                i: int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used)
                for i in gpus
            }
        finally:
            nvml.nvmlShutdown()
    except nvml.NVMLError:
        return None


async def wait_gpus_idle(
    gpus: Sequence[int], idle: Mapping[int, int] | None, limit: float
) -> bool:
    """Wait up to ``limit`` seconds until every GPU in ``gpus`` is back near its ``idle``
    memory use; True at once without NVML or a baseline, False (and a log event) if not."""
    if not gpus or idle is None:
        return True
    baseline = idle

    def back(used: dict[int, int] | None) -> bool:
        return used is None or all(used[g] <= baseline.get(g, 0) + IDLE_SLACK for g in gpus)

    used = await poll_until(lambda: asyncio.to_thread(gpu_memory_used, gpus),
                            done=back, within=limit, every=0.5)
    if back(used):
        return True
    log.warning("gpus_still_busy", used=used, idle=dict(idle), waited=limit)
    return False

"""Resources a restarted vLLM needs back: its TCP port and its GPUs' memory."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from traind.supervisor.ports import PortUse, port_use

log = structlog.get_logger("traind.supervisor")
IDLE_SLACK = 512 * 1024**2


async def wait_port_free(port: int, limit: float) -> PortUse:
    """Wait up to ``limit`` seconds until nothing holds TCP ``port`` (listening, or bound as
    a loading vLLM holds it); return what holds it last. One ``port_busy`` event names the
    holders when it is busy at first, ``port_still_busy`` when it stayed busy."""
    deadline = time.monotonic() + limit
    use = await asyncio.to_thread(port_use, port)
    if use.busy:
        log.info("port_busy", port=port, holders=use.describe(), waiting=limit)
    while use.busy:
        if time.monotonic() > deadline:
            log.warning("port_still_busy", port=port, waited=limit, holders=use.describe())
            return use
        await asyncio.sleep(0.2)
        use = await asyncio.to_thread(port_use, port)
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
    deadline = time.monotonic() + limit
    while gpus and idle is not None:
        used = await asyncio.to_thread(gpu_memory_used, gpus)
        if used is None or all(used[g] <= idle.get(g, 0) + IDLE_SLACK for g in gpus):
            break
        if time.monotonic() > deadline:
            log.warning("gpus_still_busy", used=used, idle=dict(idle), waited=limit)
            return False
        await asyncio.sleep(0.5)
    return True

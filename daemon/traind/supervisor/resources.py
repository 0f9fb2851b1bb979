"""Resources a restarted vLLM needs back: its TCP port and its GPUs' memory."""

from __future__ import annotations

import asyncio
import errno
import importlib
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

log = structlog.get_logger("traind.supervisor")
IDLE_SLACK = 512 * 1024**2


def port_in_use(port: int) -> bool:
    """True while something listens on TCP ``port`` on any local address (binding the
    wildcard address with SO_REUSEADDR fails, as the restarted server's bind would)."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, wildcard in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((wildcard, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


async def wait_port_free(port: int, limit: float) -> bool:
    """Wait up to ``limit`` seconds until nothing listens on TCP ``port``; False (and a log
    event) when it is still busy."""
    deadline = time.monotonic() + limit
    while await asyncio.to_thread(port_in_use, port):
        if time.monotonic() > deadline:
            log.warning("port_still_busy", port=port, waited=limit)
            return False
        await asyncio.sleep(0.2)
    return True


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

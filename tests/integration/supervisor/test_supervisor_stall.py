"""A vLLM server whose /health says 200 while it generates nothing (vllm#39863)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import command, engine_pids, wait_gone
from tests.support.net import free_port

from traind.config import VLLMConfig
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.vllm import VLLMRunner

STALL = 1.0


@pytest.fixture(scope="module", autouse=True)
def _subreaper() -> None:
    become_subreaper()


def config(port: int, *flags: str) -> VLLMConfig:
    return VLLMConfig.model_validate({
        "command": command(port, *flags),
        "health": {"url": f"http://127.0.0.1:{port}/health", "interval": 0.05, "timeout": 1,
                   "successes": 1, "failures": 3, "ready_timeout": 20,
                   "stall_timeout": STALL},
        "restart": {"backoff_initial": 0.05, "backoff_max": 0.1},
        "stop_grace": 1, "release_timeout": 5,
    })


async def test_busy_server_without_tokens_is_restarted(tmp_path: Path) -> None:
    """Requests running, /health 200, generated-token counter frozen: restarted as hung once
    stall_timeout passed since the last token, not before."""
    port, pids = free_port(), tmp_path / "pids"
    runner = VLLMRunner(config(port, "--fake-requests", "2", "--fake-stall-after", "0.5",
                               "--fake-pid-file", str(pids)), log_dir=tmp_path)
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        try:
            async with asyncio.timeout(40):
                await runner.wait_ready()
                ready = time.monotonic()
                await runner.wait_ready(after_starts=1)
                restarted = time.monotonic()
        finally:
            task.cancel()
            async with asyncio.timeout(15):
                with pytest.raises(asyncio.CancelledError):
                    await task
    hung = next(e for e in logs if e["event"] == "vllm_hung")
    assert hung["log_level"] == "error"
    assert (hung["running"], hung["limit"]) == (2.0, STALL)
    assert hung["generated"] > 0
    assert STALL <= restarted - ready < 0.5 + STALL + 8  # stall at 0.5 s; restart; slack
    stopped = next(e for e in logs if e["event"] == "child_stopped")
    assert stopped["reason"] == "hung"
    assert not any(e["event"] == "health_failed" for e in logs)
    assert await wait_gone(engine_pids(pids)) == []


async def test_idle_server_is_never_restarted(tmp_path: Path) -> None:
    """No request in flight: an engine that generates nothing for several stall_timeouts is
    idle, not hung."""
    port = free_port()
    runner = VLLMRunner(config(port, "--fake-stall-after", "0"), log_dir=tmp_path)
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        try:
            async with asyncio.timeout(40):
                await runner.wait_ready()
                await asyncio.sleep(3 * STALL)
        finally:
            task.cancel()
            async with asyncio.timeout(15):
                with pytest.raises(asyncio.CancelledError):
                    await task
    assert runner.starts == 1
    assert not any(e["event"] == "vllm_hung" for e in logs)

"""HTTP health checks against the vLLM stand-in: readiness, liveness, redirects, server kind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import command
from tests.support.net import free_port

from traind.config import ChildConfig, HealthConfig
from traind.errors import SupervisorError
from traind.supervisor.health import (
    HealthCheck,
    HealthRedirectError,
    Probe,
    Result,
    close_communicator,
    probe,
    server_kind,
)
from traind.supervisor.policy import Role
from traind.supervisor.process import ManagedProcess

Serve = Callable[..., Awaitable[int]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """Start the stand-in with flags; return its port; stop everything at the end."""
    started: list[ManagedProcess] = []

    async def start(*flags: str) -> int:
        port = free_port()
        config = ChildConfig(command=command(port, *flags), stop_grace=1)
        p = ManagedProcess(f"fake{len(started)}", config, Role.VLLM, log_dir=tmp_path)
        started.append(p)
        async with asyncio.timeout(5):
            await p.start()
        return port

    yield start
    async with asyncio.timeout(10):
        for p in started:
            await p.stop()


def health(port: int, path: str = "/health", **kw: float) -> HealthConfig:
    base = {"interval": 0.05, "timeout": 0.3, "successes": 2, "failures": 2, "ready_timeout": 5}
    return HealthConfig.model_validate({"url": f"http://127.0.0.1:{port}{path}", **base, **kw})


async def test_ready_after_refused_then_warmup(serve: Serve) -> None:
    """Refused while the model loads, then 503 while warming up, both count as starting;
    ready after `successes` 200s in a row."""
    port = await serve("--fake-load", "0.5", "--fake-warmup", "0.5")
    seen: list[str] = []
    async with asyncio.timeout(20), aiohttp.ClientSession() as session:
        ready = asyncio.create_task(HealthCheck(health(port, ready_timeout=15), "vllm")
                                    .wait_ready())
        while not ready.done():
            r = await probe(session, f"http://127.0.0.1:{port}/health", 0.5)
            seen.append(str(r.status or r.probe.value))
            await asyncio.sleep(0.02)
        await ready
    kinds = [k for i, k in enumerate(seen) if i == 0 or seen[i - 1] != k]
    assert kinds == ["refused", "503", "200"]


async def test_not_ready_before_deadline(serve: Serve) -> None:
    """A server still loading at ready_timeout is an error naming the URL."""
    port = await serve("--fake-load", "30")
    async with asyncio.timeout(10):
        with pytest.raises(SupervisorError, match=f"{port}/health not ready"):
            await HealthCheck(health(port, ready_timeout=0.4), "vllm").wait_ready()


async def test_503_is_unhealthy(serve: Serve) -> None:
    """A dead engine (503) for `failures` polls in a row ends the watch."""
    port = await serve("--fake-engine-dies-after", "1.5")  # past readiness, even under load
    check = HealthCheck(health(port), "vllm")
    async with asyncio.timeout(10):
        await check.wait_ready()
        result = await check.watch()
    assert (result.probe, result.status) == (Probe.BAD_STATUS, 503)


async def test_hang_is_unhealthy(serve: Serve) -> None:
    """A server that stops answering is unhealthy after `failures` timeouts."""
    port = await serve("--fake-unresponsive-after", "1.5")  # past readiness, even under load
    check = HealthCheck(health(port, timeout=0.2), "vllm")
    async with asyncio.timeout(10):
        await check.wait_ready()
        result = await check.watch()
    assert result.probe is Probe.TIMEOUT


async def test_trailing_slash_redirect_is_reported_at_once(serve: Serve) -> None:
    """vLLM answers /health/ with FastAPI's 307 to /health: readiness fails at the first
    answer with an error naming the target, not at ready_timeout."""
    port = await serve()
    url = f"http://127.0.0.1:{port}/health/"
    async with asyncio.timeout(20), aiohttp.ClientSession() as session:
        r = Result(Probe.REFUSED)
        while r.probe is Probe.REFUSED:
            r = await probe(session, url, 1)
            await asyncio.sleep(0.05)
        assert (r.probe, r.status) == (Probe.REDIRECT, 307)
        started = time.monotonic()
        with capture_logs() as logs, pytest.raises(HealthRedirectError) as err:
            await HealthCheck(health(port, "/health/", ready_timeout=15), "vllm").wait_ready()
    assert time.monotonic() - started < 2
    assert f"redirecting to http://127.0.0.1:{port}/health;" in str(err.value)
    assert "\n" not in str(err.value)
    event = next(e for e in logs if e["event"] == "health_redirect")
    assert (event["log_level"], event["status"]) == ("error", 307)


async def test_server_kind_and_no_close_communicator(serve: Serve) -> None:
    """vLLM's server is told apart by /v1/models; it has no /close_communicator/ (404)."""
    port = await serve()
    url = f"http://127.0.0.1:{port}/health"
    async with asyncio.timeout(20):
        await HealthCheck(health(port, ready_timeout=15), "vllm").wait_ready()
        assert await server_kind(url, 2) == "vllm"
        assert not await close_communicator(url, 2)
        assert await server_kind(f"http://127.0.0.1:{free_port()}/health", 1) == "unknown"

"""HTTP health checks against the vLLM stand-in: readiness, liveness, redirects, reset."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tests.support.fake_vllm import command
from tests.support.net import free_port

from traind.config import ChildConfig, HealthConfig
from traind.errors import SupervisorError
from traind.supervisor.health import HealthCheck, Probe, close_communicator, probe
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


@pytest.mark.parametrize("path", ["/health", "/health/"])
async def test_ready_after_loading(serve: Serve, path: str) -> None:
    """Refused connections while loading count as starting; ready once it answers 200."""
    port = await serve("--load-seconds", "0.5")
    started = time.monotonic()
    async with asyncio.timeout(10):
        await HealthCheck(health(port, path), "vllm").wait_ready()
    assert time.monotonic() - started >= 0.45


async def test_not_ready_before_deadline(serve: Serve) -> None:
    """A server still loading at ready_timeout is an error naming the URL."""
    port = await serve("--load-seconds", "30")
    async with asyncio.timeout(10):
        with pytest.raises(SupervisorError, match=f"{port}/health not ready"):
            await HealthCheck(health(port, ready_timeout=0.4), "vllm").wait_ready()


async def test_503_is_unhealthy(serve: Serve) -> None:
    """A dead engine (503) for `failures` polls in a row ends the watch."""
    port = await serve("--unhealthy-after", "0.3")
    check = HealthCheck(health(port), "vllm")
    async with asyncio.timeout(10):
        await check.wait_ready()
        result = await check.watch()
    assert (result.probe, result.status) == (Probe.BAD_STATUS, 503)


async def test_hang_is_unhealthy(serve: Serve) -> None:
    """A server that stops answering is unhealthy after `failures` timeouts."""
    port = await serve("--hang-after", "0.3")
    check = HealthCheck(health(port, timeout=0.2), "vllm")
    async with asyncio.timeout(10):
        await check.wait_ready()
        result = await check.watch()
    assert result.probe is Probe.TIMEOUT


async def test_redirect_is_not_followed() -> None:
    """A 3xx (e.g. /health → /health/) is an unhealthy answer, never followed silently."""

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/health/")

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", redirect)
    app.router.add_get("/health/", ok)
    runner = web.AppRunner(app)
    port = free_port()
    async with asyncio.timeout(5):
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with asyncio.timeout(10), aiohttp.ClientSession() as session:
            result = await probe(session, f"http://127.0.0.1:{port}/health", 1)
            assert (result.probe, result.status) == (Probe.BAD_STATUS, 307)
            assert "/health/" in result.detail
            ok = await probe(session, f"http://127.0.0.1:{port}/health/", 1)
            assert ok.probe is Probe.OK
            with pytest.raises(SupervisorError):
                await HealthCheck(health(port, ready_timeout=0.3), "x").wait_ready()
    finally:
        async with asyncio.timeout(5):
            await runner.cleanup()


async def test_close_communicator(serve: Serve, tmp_path: Path) -> None:
    """POST /close_communicator/ reaches the server; an absent server yields False."""
    calls = tmp_path / "closed"
    port = await serve("--close-log", str(calls))
    async with asyncio.timeout(10):
        await HealthCheck(health(port, "/health/"), "vllm").wait_ready()
        assert await close_communicator(f"http://127.0.0.1:{port}/health/", 2)
        assert not await close_communicator(f"http://127.0.0.1:{free_port()}/health", 1)
    assert len(calls.read_text().split()) == 1

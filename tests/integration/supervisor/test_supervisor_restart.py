"""Failure modes of the vLLM stand-in: clean restart with backoff, nothing left behind, FATAL."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import (
    alive,
    command,
    engine_pids,
    named_engines,
    pids_in,
    until,
    wait_gone,
)
from tests.support.net import free_port

from traind.config import VLLMConfig
from traind.supervisor.process import State
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.runner import ChildRunner
from traind.supervisor.vllm import VLLMRunner


@pytest.fixture(scope="module", autouse=True)
def _subreaper() -> None:
    become_subreaper()


def vllm_config(port: int, *flags: str, env: dict[str, str] | None = None,
                failures: int = 2, **restart: float) -> VLLMConfig:
    return VLLMConfig.model_validate({
        "command": command(port, "--fake-load", "0.2", *flags),
        "env": env or {},
        "health": {"url": f"http://127.0.0.1:{port}/health", "interval": 0.05, "timeout": 0.2,
                   "successes": 2, "failures": failures, "ready_timeout": 15},
        "restart": {"backoff_initial": 0.1, "backoff_max": 0.2, "max_restarts": 5,
                    "window": 60, "stable_after": 60, **restart},
        "stop_grace": 1,
        "release_timeout": 2,
    })


KEEP_ALIVE = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}


class Recorder:
    """Collects state changes and the leader pid of every start that became RUNNING."""

    def __init__(self) -> None:
        self.states: list[State] = []
        self.running_pids: list[int] = []

    def __call__(self, runner: ChildRunner) -> None:
        if not self.states or self.states[-1] is not runner.state:
            self.states.append(runner.state)
            if runner.state is State.RUNNING and runner.process.pid:
                self.running_pids.append(runner.process.pid)


@pytest.mark.parametrize(
    ("flags", "env", "failures", "reason"),
    [
        (("--fake-crash-after", "0.4"), {}, 2, "exited"),
        (("--fake-engine-dies-after", "0.4"), {}, 400, "exited"),
        (("--fake-engine-dies-after", "0.4"), KEEP_ALIVE, 2, "unhealthy"),
        (("--fake-unresponsive-after", "0.4"), {}, 2, "unhealthy"),
    ],
    ids=["api-crash", "engine-dead-exit-0", "engine-dead-503", "unresponsive"],
)
async def test_failure_restarts_cleanly(tmp_path: Path, flags: tuple[str, ...],
                                        env: dict[str, str], failures: int,
                                        reason: str) -> None:
    """An API server crash, the exit 0 that follows an engine's death (vLLM's watchdog), a
    dead engine's 503 (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1) and a server that stops answering
    each lead to BACKOFF, a restart, and no survivors (engine included)."""
    port, pidfile, pids = free_port(), tmp_path / "grandchildren", tmp_path / "pids"
    rec = Recorder()
    config = vllm_config(port, *flags, "--fake-grandchild", str(pidfile),
                         "--fake-pid-file", str(pids), env=env, failures=failures)
    runner = VLLMRunner(config, log_dir=tmp_path, on_change=rec, jitter=lambda: 0.5)
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        async with asyncio.timeout(30):
            await runner.wait_ready(after_starts=1)
            first, grandchild = rec.running_pids[0], pids_in(pidfile)[0]
            assert await wait_gone([first, grandchild, engine_pids(pids)[0]]) == []
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await wait_gone([*rec.running_pids, *pids_in(pidfile),
                                    *engine_pids(pids)]) == []
    exited = next(e for e in logs if e["event"] == "child_exited")
    if reason == "exited":
        assert exited["returncode"] == (1 if "--fake-crash-after" in flags else 0)
    until_backoff = rec.states[: rec.states.index(State.BACKOFF)]
    stopped = [State.STOPPING] if reason == "unhealthy" else []
    assert until_backoff == [State.STARTING, State.RUNNING, *stopped, State.EXITED]
    backoff = next(e for e in logs if e["event"] == "child_backoff")
    assert backoff["delay"] == 0.1
    assert backoff["reason"] == reason
    assert runner.outcome == "stopped"
    assert rec.states[-1] is State.EXITED


async def test_crash_loop_ends_fatal(tmp_path: Path) -> None:
    """A child that keeps crashing is FATAL after max_restarts restarts inside the window."""
    port, pidfile = free_port(), tmp_path / "grandchildren"
    config = vllm_config(port, "--fake-crash-after", "0", "--fake-grandchild", str(pidfile),
                         max_restarts=2, backoff_initial=0.05)
    runner = VLLMRunner(config, log_dir=tmp_path, jitter=lambda: 0.5)
    async with asyncio.timeout(20):
        assert await runner.run() == "fatal"
        assert await wait_gone(pids_in(pidfile)) == []
    assert runner.state is State.FATAL
    assert (runner.starts, runner.restarts) == (3, 2)
    assert len(pids_in(pidfile)) == 3



async def test_sigkilled_api_server_orphan_is_gone_after_restart(tmp_path: Path) -> None:
    """SIGKILL of the API server leaves its VLLM::EngineCore child running (vllm#55510);
    the restart stops that orphan, and the new server gets the port."""
    port, pids = free_port(), tmp_path / "pids"
    config = vllm_config(port, "--fake-pid-file", str(pids))
    runner = VLLMRunner(config, log_dir=tmp_path, jitter=lambda: 0.5)
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(30):
            await runner.wait_ready()
            await until(lambda: bool(named_engines(pids)))
            (orphan,) = named_engines(pids)
            assert runner.process.pid is not None
            os.kill(runner.process.pid, signal.SIGKILL)
            await runner.wait_ready(after_starts=1)
            assert await wait_gone([orphan]) == []
            assert len(engine_pids(pids)) == 2
            assert alive(engine_pids(pids)[1])
    finally:
        task.cancel()
        async with asyncio.timeout(15):
            with pytest.raises(asyncio.CancelledError):
                await task
    assert await wait_gone(engine_pids(pids)) == []


async def test_redirecting_health_url_is_fatal_at_once(tmp_path: Path) -> None:
    """A health URL vLLM answers with 307 (/health/) ends the child FATAL at the first answer,
    with an error naming the redirect target, instead of failing after ready_timeout."""
    port, pids = free_port(), tmp_path / "pids"
    config = VLLMConfig.model_validate({
        **vllm_config(port, "--fake-pid-file", str(pids)).model_dump(),
        "health": {"url": f"http://127.0.0.1:{port}/health/", "interval": 0.05,
                   "ready_timeout": 600},
    })
    runner = VLLMRunner(config, log_dir=tmp_path)
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            assert await runner.run() == "fatal"
    assert runner.state is State.FATAL
    assert runner.starts == 1
    redirect = next(e for e in logs if e["event"] == "health_redirect")
    assert (redirect["log_level"], redirect["location"]) == (
        "error", f"http://127.0.0.1:{port}/health")
    fatal = next(e for e in logs if e["event"] == "child_fatal")
    assert fatal["reason"] == "misconfigured"
    assert await wait_gone(engine_pids(pids)) == []

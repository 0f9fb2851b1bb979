"""The Supervisor: start order, ordered stop within grace periods, dependency failures."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import command, pids_in, wait_gone
from tests.support.net import free_port

from traind.config import ServiceConfig, TrainerConfig, VLLMConfig
from traind.supervisor.process import State
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.runner import ChildStatus
from traind.supervisor.supervisor import Supervisor

TRAINER = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.1)\n"
FAST = {"backoff_initial": 0.05, "backoff_max": 0.1, "max_restarts": 3, "window": 60,
        "stable_after": 60}


@pytest.fixture(scope="module", autouse=True)
def _subreaper() -> None:
    become_subreaper()


def health(port: int, path: str = "/health") -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:{port}{path}", "interval": 0.05, "timeout": 0.2,
            "successes": 2, "failures": 2, "ready_timeout": 15}


def vllm(port: int, *flags: str, **kw: Any) -> VLLMConfig:
    return VLLMConfig.model_validate({
        "command": command(port, "--fake-load", "0.3", *flags),
        "health": health(port), "restart": FAST, "stop_grace": 1,
        "release_timeout": 2, **kw,
    })


def service(port: int, *flags: str, **kw: Any) -> ServiceConfig:
    return ServiceConfig.model_validate({
        "name": "env-server", "command": command(port, "--fake-load", "0.2", *flags),
        "health": health(port), "restart": FAST, "stop_grace": 1, **kw,
    })


def trainer(**kw: Any) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "command": (sys.executable, "-c", TRAINER), "restart": FAST, "stop_grace": 1,
        "progress_timeout": None, "first_progress_timeout": None, **kw,
    })


class Events:
    """(child, state) in the order they happened, and every pid that ever ran."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.pids: set[int] = set()

    def __call__(self, status: ChildStatus) -> None:
        if status.pid:
            self.pids.add(status.pid)
        if not self.seen or self.seen[-1] != (status.name, status.state):
            self.seen.append((status.name, status.state))

    def index(self, name: str, state: State) -> int:
        return self.seen.index((name, state.value))


async def until(check: Any, task: asyncio.Task[str], within: float = 15.0) -> None:
    """Poll ``check``; on timeout cancel the supervisor ``task`` (stopping its children)."""
    try:
        async with asyncio.timeout(within):
            while True:
                if check():
                    return
                await asyncio.sleep(0.02)
    except BaseException:
        task.cancel()
        async with asyncio.timeout(15):
            await asyncio.gather(task, return_exceptions=True)
        raise


async def test_start_order(tmp_path: Path) -> None:
    """Services are RUNNING before vLLM starts; vLLM is ready before the trainer starts."""
    events = Events()
    sup = Supervisor(state_dir=tmp_path, services=[service(free_port())], vllm=vllm(free_port()),
                     trainer=trainer(), on_change=events)
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: sup.trainer is not None and sup.trainer.state is State.RUNNING, task)
    finally:
        async with asyncio.timeout(15):
            await sup.stop()
            assert await task == "stopped"
    assert events.index("env-server", State.RUNNING) < events.index("vllm", State.STARTING)
    assert events.index("vllm", State.RUNNING) < events.index("trainer", State.STARTING)
    assert [s.state for s in sup.status()] == ["EXITED"] * 3
    assert (tmp_path / "logs" / "vllm.log").read_text().count("Starting vLLM server on") == 1


async def test_stop_is_ordered_and_bounded(tmp_path: Path) -> None:
    """stop() ends trainer, vLLM, then services; SIGTERM-deaf ones die by SIGKILL after grace,
    escaped grandchildren included, well within the sum of the grace periods."""
    events, pidfile = Events(), tmp_path / "grandchildren"
    sup = Supervisor(
        state_dir=tmp_path,
        services=[service(free_port(), "--fake-ignore-sigterm", stop_grace=0.5)],
        vllm=vllm(free_port(), "--fake-grandchild", str(pidfile), "--fake-ignore-sigterm",
                  stop_grace=0.5),
        trainer=trainer(), on_change=events,
    )
    task = asyncio.create_task(sup.run())
    await until(lambda: sup.trainer is not None and sup.trainer.state is State.RUNNING, task)
    started = time.monotonic()
    async with asyncio.timeout(10):
        await sup.stop()
        took = time.monotonic() - started
        assert await task == "stopped"
        assert await wait_gone([*events.pids, *pids_in(pidfile)]) == []
    assert 1.0 <= took < 1 + 0.5 + 0.5 + 3
    stopping = [name for name, state in events.seen if state == "STOPPING"]
    assert stopping == ["trainer", "vllm", "env-server"]


async def test_cancelling_run_stops_everything(tmp_path: Path) -> None:
    """Cancelling run() (the daemon's TaskGroup shutting down) stops all children in order."""
    events = Events()
    sup = Supervisor(state_dir=tmp_path, vllm=vllm(free_port()), trainer=trainer(),
                     on_change=events)
    task = asyncio.create_task(sup.run())
    await until(lambda: sup.trainer is not None and sup.trainer.state is State.RUNNING, task)
    task.cancel()
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_gone(events.pids) == []
    assert [name for name, state in events.seen if state == "STOPPING"] == ["trainer", "vllm"]
    assert sup.outcome == "stopped"


async def test_a_crashed_runner_ends_the_run_in_order(tmp_path: Path) -> None:
    """A bug in one child's runner is logged as ``child_runner_crashed`` and ends the run
    like any child that ended: the others are stopped in order and ``run`` returns."""
    events = Events()

    def crash_once(status: ChildStatus) -> None:
        events(status)
        if status.name == "trainer" and status.state == "RUNNING" and status.starts == 1:
            raise RuntimeError("bug in a callback (test)")

    sup = Supervisor(state_dir=tmp_path, vllm=vllm(free_port()), trainer=trainer(),
                     on_change=crash_once)
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            assert await sup.run() == "stopped"
        assert await wait_gone(events.pids) == []
    crashed = [e for e in logs if e["event"] == "child_runner_crashed"]
    assert [(e["child"], e["log_level"]) for e in crashed] == [("trainer", "error")]
    assert "bug in a callback" in crashed[0]["error"]
    assert [name for name, state in events.seen if state == "STOPPING"] == ["trainer", "vllm"]


async def test_vllm_restart_restarts_running_trainer(tmp_path: Path) -> None:
    """When vLLM dies under a running trainer, the trainer is restarted after vLLM is back,
    without counting against the trainer's restart budget."""
    sup = Supervisor(state_dir=tmp_path, vllm=vllm(free_port(), "--fake-crash-after", "0.8"),
                     trainer=trainer())
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: sup.trainer is not None and sup.trainer.starts >= 2, task)
        assert sup.vllm is not None
        assert sup.trainer is not None
        assert sup.vllm.starts >= 2
        assert sup.trainer.restarts == 0
    finally:
        async with asyncio.timeout(10):
            await sup.stop()
            await task


async def test_fatal_dependency_fails_the_run(tmp_path: Path) -> None:
    """vLLM crash-looping into FATAL ends the run as failed; the trainer never starts."""
    crashing = vllm(free_port(), "--fake-crash-after", "0", restart=FAST | {"max_restarts": 1})
    sup = Supervisor(state_dir=tmp_path, vllm=crashing, trainer=trainer())
    async with asyncio.timeout(20):
        assert await sup.run() == "failed"
    assert sup.vllm is not None
    assert sup.trainer is not None
    assert sup.vllm.state is State.FATAL
    assert sup.trainer.starts == 0
    assert not sup.finished.is_set()

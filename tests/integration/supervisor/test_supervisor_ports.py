"""The port check before a vLLM restart sees what vLLM's own bind would share the port with."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import ENGINE_NAME, command, engine_pids, named_engines, until
from tests.support.net import free_port

from traind.config import ChildConfig, VLLMConfig
from traind.supervisor.policy import Role
from traind.supervisor.ports import port_use
from traind.supervisor.process import ManagedProcess, State
from traind.supervisor.vllm import VLLMRunner


def reuse_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def test_bound_not_listening_is_busy() -> None:
    """A socket bound with SO_REUSEADDR|SO_REUSEPORT and not listening (vLLM loading) holds
    the port, though a second such socket could still bind and listen on it."""
    with reuse_socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        use = port_use(port)
        assert use.busy
        assert [(h.pid, h.state) for h in use.holders] == [(os.getpid(), "bound")]
        with reuse_socket() as second:
            second.bind(("127.0.0.1", port))
            second.listen()  # what a second vLLM would do: no collision
    assert not port_use(port).busy


def test_time_wait_leaves_the_port_free() -> None:
    """A TIME_WAIT connection left by a stopped server does not stop vLLM's bind: free."""
    with reuse_socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end goes to TIME_WAIT
        time.sleep(0.1)
        client.close()
    assert not port_use(port).busy


async def test_loading_leftover_blocks_the_start_and_is_named(tmp_path: Path) -> None:
    """A leftover vLLM still loading (bound, not listening) keeps a new one from starting;
    the failed start names its processes, and the start succeeds once it is gone."""
    port, pids = free_port(), tmp_path / "leftover.pids"
    leftover = ManagedProcess(
        "leftover",
        ChildConfig(command=command(port, "--fake-load", "60", "--fake-pid-file", str(pids)),
                    stop_grace=1),
        Role.VLLM, log_dir=tmp_path)
    config = VLLMConfig.model_validate({
        "command": command(port),
        "health": {"url": f"http://127.0.0.1:{port}/health", "interval": 0.05,
                   "successes": 1, "ready_timeout": 20},
        "restart": {"backoff_initial": 0.2, "backoff_max": 0.2},
        "release_timeout": 0.5, "stop_grace": 1,
    })
    runner = VLLMRunner(config, log_dir=tmp_path)
    task: asyncio.Task[str] | None = None
    try:
        async with asyncio.timeout(30):
            await leftover.start()
            await until(lambda: bool(named_engines(pids)) and port_use(port).busy)
            with capture_logs() as logs:
                task = asyncio.create_task(runner.run())
                await until(lambda: any(e["event"] == "child_start_failed" for e in logs))
            failed = next(e for e in logs if e["event"] == "child_start_failed")
            busy = next(e for e in logs if e["event"] == "port_busy")
            assert runner.starts == 0
            engine = engine_pids(pids)[0]
            for text in (failed["error"], busy["holders"]):
                assert f"pid {engine} ({ENGINE_NAME[:15]}, bound)" in text
                assert f"pid {leftover.pid} (python" in text
            await leftover.stop()
            await runner.wait_ready()
            assert runner.state is State.RUNNING
    finally:
        async with asyncio.timeout(15):
            await leftover.stop()
            if task is not None:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

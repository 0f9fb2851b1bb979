"""The stand-in against facts read from the installed TRL: the command ``trl vllm-serve``
builds (run as vLLM's CLI would run it) and the routes TRL's VLLMClient calls."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_vllm import SCRIPT, install_as_vllm
from tests.support.net import free_port
from tests.support.requires import need_module
from yarl import URL

from traind.config import ChildConfig, VLLMConfig
from traind.supervisor.health import fetch_text, server_kind
from traind.supervisor.policy import Role
from traind.supervisor.process import ManagedProcess
from traind.supervisor.vllm import VLLMRunner

Serve = Callable[[bool], Awaitable[int]]


def trl_command(port: int) -> list[str]:
    """What the installed ``trl vllm-serve`` execs, with vLLM's CLI module swapped for the
    stand-in (``python -m vllm.entrypoints.cli.main serve ...`` → ``python fake_vllm.py
    serve ...``)."""
    need_module("trl")
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    built = build_command(ScriptArguments(model="Qwen/Qwen2.5-0.5B", host="127.0.0.1",
                                          port=port))
    assert built[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    return [sys.executable, str(SCRIPT), *built[3:]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """Start the stand-in from TRL's command, with or without VLLM_SERVER_DEV_MODE=1 (which
    ``trl vllm-serve`` sets); return its port."""
    started: list[ManagedProcess] = []

    async def start(dev_mode: bool) -> int:
        port = free_port()
        env = {"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}
        config = ChildConfig(command=(*trl_command(port), "--fake-request-log",
                                      str(tmp_path / f"calls-{port}")), env=env, stop_grace=2)
        p = ManagedProcess(f"vllm{len(started)}", config, Role.VLLM, log_dir=tmp_path)
        started.append(p)
        async with asyncio.timeout(10):
            await p.start()
        return port

    yield start
    async with asyncio.timeout(15):
        for p in started:
            await p.stop()


def client(port: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """TRL's own VLLMClient (vLLM itself is not installed, so its presence check is
    answered yes); it waits for /health and reads /v1/models as in a GRPO run."""
    from trl.generation import vllm_client

    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *a, **kw: True)
    return vllm_client.VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=30)


async def test_trl_client_routes_in_dev_mode(serve: Serve, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The server TRL's command starts answers every route VLLMClient uses outside CUDA:
    /health, /v1/models, /server_info (with the NCCL weight-transfer config TRL passes),
    /get_world_size, /reset_prefix_cache, the weight-update bracket and /v1/completions."""
    port = await serve(True)

    def session() -> dict[str, Any]:
        c = client(port, monkeypatch)
        out = {"model": c.model, "info": c.get_server_info(), "world": c.get_world_size()}
        c.reset_prefix_cache()
        with c.weight_update():
            pass
        out["generated"] = c.generate(["hello there"], n=2, max_tokens=3)
        return out

    async with asyncio.timeout(60):
        got = await asyncio.to_thread(session)
    assert got["model"] == "Qwen/Qwen2.5-0.5B"
    assert got["info"]["weight_transfer_config"] == {"backend": "nccl"}
    assert got["world"] == 1
    assert got["generated"]["completion_ids"] == [[7, 7, 7], [7, 7, 7]]
    assert len(got["generated"]["logprobs"]) == 2
    calls = (tmp_path / f"calls-{port}").read_text().splitlines()
    assert calls == ["GET /server_info", "GET /get_world_size", "POST /reset_prefix_cache",
                     "POST /start_weight_update", "POST /finish_weight_update"]


async def test_without_dev_mode_trl_names_the_missing_setting(
        serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without VLLM_SERVER_DEV_MODE=1 the dev routes are 404, which TRL's client reports as
    the missing setting; /health and /v1/models still work."""
    port = await serve(False)

    def session() -> str:
        c = client(port, monkeypatch)
        with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1") as err:
            c.get_server_info()
        return str(err.value)

    async with asyncio.timeout(60):
        assert "development endpoints" in await asyncio.to_thread(session)


async def test_trl_vllm_serve_under_traind(tmp_path: Path) -> None:
    """`trl vllm-serve` itself as the [vllm] command: TRL's CLI execs vLLM's (here the
    stand-in, installed as the vllm package) in dev mode with the NCCL weight-transfer
    config and --enable-scale-out; traind sees it ready on /health and as vLLM's server."""
    need_module("trl")
    port = free_port()
    shim = install_as_vllm(tmp_path / "vllm")
    config = VLLMConfig.model_validate({
        "command": ["trl", "vllm-serve", "--model", "Qwen/Qwen2.5-0.5B", "--host", "127.0.0.1",
                    "--port", str(port)],
        "env": {"PYTHONPATH": shim["PYTHONPATH"]},
        "health": {"url": f"http://127.0.0.1:{port}/health", "interval": 0.1,
                   "successes": 2, "ready_timeout": 60},
        "stop_grace": 2,
    })
    runner = VLLMRunner(config, log_dir=tmp_path)
    task = asyncio.create_task(runner.run())
    root = URL(f"http://127.0.0.1:{port}")
    try:
        async with asyncio.timeout(90):
            await runner.wait_ready()
            assert await server_kind(str(root / "health"), 5) == "vllm"
            info = await fetch_text(root / "server_info", 5)
            render = await fetch_text(root / "v1/chat/completions/render/", 5)
    finally:
        task.cancel()
        async with asyncio.timeout(20):
            with pytest.raises(asyncio.CancelledError):
                await task
    assert info is not None
    assert json.loads(info[1])["vllm_config"]["weight_transfer_config"] == {"backend": "nccl"}
    assert render == (307, "")  # the route exists (scale-out): FastAPI redirects the slash

"""``backend = "docker"`` against a real dockerd (tests/support/dockerd.py) through aiodocker:
the whole life cycle with a real ``traind run`` and a tiny TRL run in a container, each bad
input with its clear error, and nothing left in the engine's own container list."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiodocker
import pytest
from tests.integration.launch.lifecycle import (
    Launcher,
    committed,
    job_config,
    outlive,
    project,
    resuming,
    status_pull_down,
    trainer_pids,
)
from tests.support.dockerd import Dockerd, labelled
from tests.support.requires import need_module

from traind.launch.commands import jobflow
from traind.launch.errors import LaunchError
from traind.launch.handles import LaunchStore
from traind.launch.jobs import LABEL, JobState
from traind.launch.providers.docker.engine import (
    EngineUnreachableError,
    GPURequestError,
    ImageNotFoundError,
)
from traind.launch.registry import open_job_backend
from traind.util.poll import poll_until

pytestmark = pytest.mark.timeout(120)
CHECKOUT = Path(__file__).resolve().parents[3]
TRAIND = str(CHECKOUT / ".venv" / "bin" / "traind")
"""traind in the container: this checkout's virtualenv, bind-mounted at its own path."""


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LaunchStore:
    """Launch records under tmp_path."""
    monkeypatch.setenv("TRAIND_LAUNCH_STATE", str(tmp_path / "state"))
    return LaunchStore()


def table(dockerd: Dockerd, image: str, tmp_path: Path, **more: Any) -> dict[str, Any]:
    """A ``[docker]`` table: this checkout (read-only) and tmp_path mounted at their paths."""
    return {"image": image, "host": dockerd.host, "traind": TRAIND, "network": "host",
            "mounts": [f"{CHECKOUT}:{CHECKOUT}:ro", f"{tmp_path}:{tmp_path}"],
            "poll_interval": "200ms", "cancel_timeout": "30s", "stop_timeout": "10s",
            **more}


def toml_table(values: dict[str, Any]) -> str:
    """``values`` as TOML lines (strings, numbers, lists and flat tables)."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {json.dumps(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    return "\n".join(f"{key} = {value(v)}" for key, v in values.items())


def context(tmp_path: Path, store: LaunchStore, docker: dict[str, Any]) -> jobflow.Context:
    """A docker launch whose traind config is a real one (a local store, no trainer)."""
    cfg = job_config(tmp_path, "dk", "docker", docker)
    return jobflow.Context(cfg, open_job_backend(cfg), store)


async def left(dockerd: Dockerd, name: str) -> list[dict[str, object]]:
    """Every container of launch ``name`` the engine still has, in any state."""
    return await labelled(dockerd.host, f"{LABEL}={name}")


@pytest.mark.timeout(300)
async def test_docker_life_cycle(
    tmp_path: Path, dockerd: Dockerd, base_image: str, store: LaunchStore
) -> None:
    """``traind launch`` starts a container running ``traind run`` (config as environment),
    follows its log to the end of a tiny TRL run; ``status`` says completed with the last
    commit, ``pull`` brings the newest checkpoint from the store, ``down`` removes it."""
    need_module("trl")
    docker = table(dockerd, base_image, tmp_path, timeout="250s", labels={"team": "ml"})
    launch_toml = project(tmp_path, max_steps=2, backend_toml=(
        f'backend = "docker"\n\n[docker]\n{toml_table(docker)}\n'))
    env = dict(os.environ)
    launcher = Launcher("-c", str(launch_toml), env=env)
    try:
        assert await asyncio.to_thread(launcher.wait, 250) == 0, launcher.tail()
        assert any(committed(line, 2) for line in launcher.out), launcher.tail()
        steps = [e["step"] for e in launcher.events() if e.get("event") == "launch_step"]
        assert steps == ["submit", "wait_running"]
        (container,) = await left(dockerd, "tiny")
        assert container["Labels"]["team"] == "ml"  # type: ignore[index]
        assert container["State"] == "exited"
        facts, _ = await status_pull_down(tmp_path, env)
        assert facts["instance"] == container["Id"]
        assert await left(dockerd, "tiny") == []
        assert store.names() == []
    finally:
        launcher.kill()


@pytest.mark.timeout(240)
async def test_down_stops_and_removes_a_running_container(
    tmp_path: Path, dockerd: Dockerd, base_image: str, store: LaunchStore
) -> None:
    """``launch --detach`` leaves the container training; ``down --no-pull`` stops and
    removes it: the engine lists nothing of the launch and the trainer is gone."""
    need_module("trl")
    docker = table(dockerd, base_image, tmp_path)
    launch_toml = project(tmp_path, max_steps=200, backend_toml=(
        f'backend = "docker"\n\n[docker]\n{toml_table(docker)}\n'))
    env = dict(os.environ)
    launcher = Launcher("-c", str(launch_toml), "--detach", env=env)

    async def probe() -> list[int]:
        return trainer_pids(tmp_path / "remote/out")

    try:
        assert await asyncio.to_thread(launcher.wait, 60) == 0, launcher.tail()
        assert await poll_until(probe, within=120, every=0.2), launcher.tail()
        down = Launcher("down", "tiny", "--no-pull", env=env)
        assert await asyncio.to_thread(down.wait, 90) == 0, down.tail()
        assert await left(dockerd, "tiny") == []
        assert store.names() == []
        assert not await poll_until(probe, done=lambda pids: not pids, within=20, every=0.2)
    finally:
        launcher.kill()


async def test_container_past_its_timeout_is_stopped_and_reported_as_timeout(
    tmp_path: Path, dockerd: Dockerd, base_image: str, store: LaunchStore
) -> None:
    """The adapter stops a container at ``timeout`` while following it: the launch ends
    ``timeout``, status says so, and ``down`` leaves nothing in the engine's list."""
    ctx = context(tmp_path, store, table(dockerd, base_image, tmp_path, timeout="3s"))
    lines: list[str] = []
    async with asyncio.timeout(60):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        outcome = await jobflow.follow(ctx, record, asyncio.Event(), lines.append)
        facts = await jobflow.status(ctx, record)
        assert (outcome, facts["state"]) == ("timeout", "timeout"), lines
        assert "timeout of 3s" in facts["message"]
        await jobflow.down(ctx, record, pull_first=False)
    assert await left(dockerd, "dk") == []


async def test_a_container_ends_at_its_timeout_with_nobody_watching(
    tmp_path: Path, dockerd: Dockerd, base_image: str, store: LaunchStore
) -> None:
    """A launched container that nothing follows (a ``--detach``) still ends at ``timeout``:
    traind in it is sent SIGTERM, as by ``docker stop``, and exits 0; the engine lists it
    exited, and the adapter reports it TIMEOUT."""
    ctx = context(tmp_path, store, table(dockerd, base_image, tmp_path, timeout="3s"))

    async def listed() -> dict[str, object]:
        (container,) = await left(dockerd, "dk")
        return container

    async with asyncio.timeout(90):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        ended = await poll_until(listed, done=lambda c: c["State"] == "exited", within=60,
                                 every=0.5)
        assert ended["State"] == "exited", ended
        assert str(ended["Status"]).startswith("Exited (0)"), ended
        assert (await ctx.backend.inspect(record.handle)).state is JobState.TIMEOUT
        await jobflow.down(ctx, record, pull_first=False)
    assert await left(dockerd, "dk") == []


async def test_missing_image_is_named_and_nothing_is_left(
    tmp_path: Path, dockerd: Dockerd, store: LaunchStore
) -> None:
    """An image the engine does not have is named in the error; no container, no record."""
    ctx = context(tmp_path, store, table(dockerd, "nope:1", tmp_path))
    with pytest.raises(ImageNotFoundError, match="no image: No such image: nope:1"):
        async with asyncio.timeout(30):
            await jobflow.launch(ctx, tmp_path / "l.toml")
    assert await left(dockerd, "dk") == []
    assert store.names() == []


async def test_unreachable_engine_is_named(
    tmp_path: Path, dockerd: Dockerd, store: LaunchStore
) -> None:
    """An engine socket nobody listens on is named, with the way to point at another."""
    docker = table(dockerd, "img:1", tmp_path, host=f"unix://{tmp_path}/none.sock")
    with pytest.raises(EngineUnreachableError,
                       match=rf"cannot reach the Docker Engine at unix://{tmp_path}/none.sock"):
        async with asyncio.timeout(30):
            await jobflow.launch(context(tmp_path, store, docker), tmp_path / "l.toml")
    assert store.names() == []


async def test_gpus_the_engine_cannot_give_are_refused_and_removed(
    tmp_path: Path, dockerd: Dockerd, base_image: str, store: LaunchStore
) -> None:
    """``gpus = 1`` on an engine without the NVIDIA runtime fails to start, naming the GPU
    request; the created container is removed again. A bad ``gpus`` value is a config error."""
    ctx = context(tmp_path, store, table(dockerd, base_image, tmp_path, gpus=1))
    with pytest.raises(GPURequestError, match=r"GPUs asked for cannot be given.*nvidia"):
        async with asyncio.timeout(30):
            await jobflow.launch(ctx, tmp_path / "l.toml")
    assert await left(dockerd, "dk") == []
    assert store.names() == []
    for bad in (-1, "some"):
        with pytest.raises(ValueError, match="gpus"):
            context(tmp_path, store, table(dockerd, base_image, tmp_path, gpus=bad))


@pytest.mark.timeout(480)
async def test_a_run_outlives_a_killed_and_a_stopped_container(
    tmp_path: Path, dockerd: Dockerd, base_image: str, store: LaunchStore
) -> None:
    """A container killed through the engine (SIGKILL, as a host that died) and one stopped
    (SIGTERM, SIGKILL after the grace, as a host shutting down) mid-training are replaced: each
    next one restores the newest committed checkpoint, the run ends with the trainer's exit 0,
    no step trained more than once again, and the engine lists nothing of the launch running."""
    need_module("trl")
    docker = table(dockerd, base_image, tmp_path)
    launch_toml = project(tmp_path, max_steps=10, backend_toml=(
        f'backend = "docker"\n\n[docker]\n{toml_table(docker)}\n'))
    resuming(tmp_path)
    launcher = Launcher("-c", str(launch_toml), env=dict(os.environ))

    def ending(how: str) -> Callable[[], Awaitable[None]]:
        async def ended() -> None:
            (running,) = [c for c in await left(dockerd, "tiny") if c["State"] == "running"]
            async with aiodocker.Docker(url=dockerd.host) as engine:
                container = engine.containers.container(str(running["Id"]))
                await (container.kill() if how == "kill" else container.stop(t=5))
                await asyncio.wait_for(container.wait(), 30)
        return ended

    try:
        recovered = await outlive(launcher, tmp_path / "remote", [
            ("killed (docker kill)", ending("kill")), ("stopped (docker stop)", ending("stop"))])
        for recovery in recovered:
            print(recovery.row("docker"))
        containers = await left(dockerd, "tiny")
        assert len(containers) == 1  # the last one, exited 0 (kept for logs until `down`)
        assert [(c["State"], c["Status"][:9]) for c in containers] == [("exited", "Exited (0")]
    finally:
        launcher.kill()
        for container in await left(dockerd, "tiny"):
            async with aiodocker.Docker(url=dockerd.host) as engine:
                await engine.containers.container(str(container["Id"])).delete(force=True)


def test_launch_error_tree() -> None:
    """The engine's refusals are LaunchErrors (the CLI prints them without a traceback)."""
    assert issubclass(ImageNotFoundError, LaunchError)
    assert issubclass(GPURequestError, LaunchError)
    assert issubclass(EngineUnreachableError, LaunchError)

"""The RunPod, Lambda and Nebius adapters against stand-ins written from each provider's
published API, whose instances are a real sshd on loopback: offers, the failures a launch
meets (no offer, quota, never running, SSH silent, rate limits) and what each leaves billed,
and the whole ``traind launch`` life cycle with a tiny TRL run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.integration.launch.clouds import CLOUDS, Cloud, backend_toml, running
from tests.integration.launch.lifecycle import (
    Launcher,
    committed,
    kill_traind,
    outlive,
    project,
    resuming,
    trained_steps,
)
from tests.support.fake_cloud import LoopbackHost
from tests.support.net import free_port
from tests.support.requires import need_binary, need_module
from tests.support.sshd import SSHServer

from traind.launch.base import Constraints, HostBackend, HostState
from traind.launch.commands import flow
from traind.launch.config import LaunchConfig
from traind.launch.errors import (
    HostUnreachableError,
    NoOffersError,
    ProvisionError,
)
from traind.launch.handles import LaunchStore
from traind.launch.registry import open_backend
from traind.util.poll import poll_until

pytestmark = pytest.mark.timeout(60)
H100 = Constraints(gpu=("H100",), min_gpu_ram_gb=80)
CHEAPEST_H100 = {"runpod": ("H100 SXM", 2.69, "US-KS-2"), "lambda": ("H100 SXM5", 3.29,
                 "us-south-1"), "nebius": ("H100 NVLink", 2.95, "")}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """One real sshd on loopback for every test here: the host each stand-in rents out."""
    server = SSHServer(need_binary("sshd"), tmp_path_factory.mktemp("sshd"))
    server.start_sync()
    try:
        yield server
    finally:
        server.stop_sync()


@pytest.fixture
def host(sshd: SSHServer) -> LoopbackHost:
    """The loopback host, with no key authorized until a provider installs one."""
    keys = sshd.root / "authorized_keys"
    keys.write_text("")
    return LoopbackHost(port=sshd.port, authorized_keys=keys)


@pytest.fixture(params=CLOUDS)
async def cloud(
    request: pytest.FixtureRequest, host: LoopbackHost, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cloud]:
    """Each provider's stand-in, its credentials in the environment as its CLI would have
    them."""
    async with running(request.param, host) as served:
        for name, value in served.env.items():
            monkeypatch.setenv(name, value)
        yield served


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LaunchStore:
    """Launch records under tmp_path."""
    monkeypatch.setenv("TRAIND_LAUNCH_STATE", str(tmp_path / "state"))
    return LaunchStore()


def launch_config(tmp_path: Path, cloud: Cloud, sshd: SSHServer, **sections: Any) -> LaunchConfig:
    """A launch of ``cloud`` whose code is one file; ``sections`` are merged in."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('train')\n")
    (tmp_path / "traind.toml").write_text("[run]\nname = 'x'\n")
    data: dict[str, Any] = {
        "name": "ct", "backend": cloud.name,
        "run": {"code_dir": "code", "traind_config": "traind.toml"},
        "constraints": {"num_gpus": 1},
        "host": {"ssh_key": str(sshd.user_key.path), "wait_running": "5s", "image": "img:1",
                 "disk_gb": 64},
        cloud.name: cloud.table(),
    }
    for key, value in sections.items():
        data[key] = data.get(key, {}) | value
    return LaunchConfig.model_validate(data, context={"base": tmp_path})


def adapter(cfg: LaunchConfig, store: LaunchStore) -> HostBackend:
    return open_backend(cfg, store)


async def test_offers_are_normalised(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """Search maps the provider's catalogue onto offers (model, count, GPU memory, price per
    hour, region) that [constraints] filter the same way everywhere; the key is never logged."""
    backend = adapter(launch_config(tmp_path, cloud, sshd), store)
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            offers = await backend.search_offers(H100)
    name, price, region = CHEAPEST_H100[cloud.name]
    assert (offers[0].gpu_name, offers[0].num_gpus, offers[0].location) == (name, 1, region)
    assert offers[0].price_per_hour == pytest.approx(price)
    assert offers[0].gpu_ram_gb >= 80
    assert all(o.price_per_hour >= offers[0].price_per_hour for o in offers)
    secrets = list(cloud.env.values())
    assert not any(s in repr(logs) for s in secrets)


async def test_no_matching_offer_rents_nothing(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """No offer matching the constraints: NoOffersError, nothing created, nothing saved."""
    cfg = launch_config(tmp_path, cloud, sshd, constraints={"gpu": "B200"})
    ctx = flow.Context(cfg, adapter(cfg, store), store)
    async with asyncio.timeout(20):
        with pytest.raises(NoOffersError):
            await flow.launch(ctx, tmp_path / "launch.toml")
    assert cloud.created() == 0
    assert store.names() == []


async def test_quota_refusal_names_the_providers_words(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """A create refused for quota or balance is a ProvisionError carrying the provider's own
    message; nothing is left billed or saved."""
    cloud.refuse_quota()
    cfg = launch_config(tmp_path, cloud, sshd)
    ctx = flow.Context(cfg, adapter(cfg, store), store)
    async with asyncio.timeout(20):
        with pytest.raises(ProvisionError, match=cloud.quota_words):
            await flow.launch(ctx, tmp_path / "launch.toml")
    assert cloud.live() == []
    assert store.names() == []


async def test_never_running_is_torn_down(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """An instance that never reaches running fails the launch after wait_running; it is
    destroyed (the provider confirms it gone) and the launch forgotten."""
    cloud.never_running()
    cfg = launch_config(tmp_path, cloud, sshd, host={"wait_running": "0.5s"})
    ctx = flow.Context(cfg, adapter(cfg, store), store)
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            with pytest.raises(ProvisionError, match="not running after"):
                await flow.launch(ctx, tmp_path / "launch.toml")
    assert cloud.created() == 1
    assert cloud.live() == []
    assert store.names() == []
    events = [e["event"] for e in logs]
    assert "launch_instance_destroyed" in events
    assert "launch_failed_torn_down" in events


async def test_ssh_never_answering_is_torn_down(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """The instance runs but its SSH port never answers: the launch fails on connecting and
    the instance is destroyed, nothing left billed."""
    cloud.host.port = free_port()
    cfg = launch_config(tmp_path, cloud, sshd, host={"wait_running": "1s"})
    ctx = flow.Context(cfg, adapter(cfg, store), store)
    with capture_logs() as logs:
        async with asyncio.timeout(40):
            with pytest.raises(HostUnreachableError):
                await flow.launch(ctx, tmp_path / "launch.toml")
    assert cloud.created() == 1
    assert cloud.live() == []
    assert store.names() == []
    assert [e["step"] for e in logs if e["event"] == "launch_step_failed"] == ["connect"]


async def test_rate_limits_are_waited_out(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """When the provider rate-limits us, the adapter waits (and says so) instead of failing:
    the search and the create go through."""
    cloud.rate_limit()
    backend = adapter(launch_config(tmp_path, cloud, sshd), store)
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            offer = (await backend.search_offers(H100))[0]
            handle = await backend.provision(offer, 64, "img:1", sshd.user_key.public, "ct")
            await backend.teardown(handle)
    assert cloud.rate_limited() > 0
    waits = [e for e in logs if e["event"] == "launch_api_waiting"]
    assert waits
    assert all(e["backend"] == cloud.name and e["seconds"] > 0 for e in waits)
    assert cloud.live() == []


async def test_nebius_without_capacity_leaves_nothing(
    tmp_path: Path, host: LoopbackHost, sshd: SSHServer, store: LaunchStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Nebius create whose operation fails for want of resources is a ProvisionError in
    Nebius's words, and the instance it made is deleted before provision returns."""
    async with running("nebius", host) as cloud:
        for name, value in cloud.env.items():
            monkeypatch.setenv(name, value)
        cloud.fake.no_capacity = True
        cfg = launch_config(tmp_path, cloud, sshd)
        ctx = flow.Context(cfg, adapter(cfg, store), store)
        async with asyncio.timeout(30):
            with pytest.raises(ProvisionError, match="not enough resources"):
                await flow.launch(ctx, tmp_path / "launch.toml")
        assert cloud.created() == 1
        assert cloud.live() == []
    assert store.names() == []


async def test_lambda_requests_keep_to_its_limits(
    tmp_path: Path, host: LoopbackHost, sshd: SSHServer, store: LaunchStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paced like Lambda's published limits (one request per interval, one launch per longer
    one), a search, launch and teardown meet no 429, and the waits are logged."""
    async with running("lambda", host) as cloud:
        for name, value in cloud.env.items():
            monkeypatch.setenv(name, value)
        cfg = launch_config(tmp_path, cloud, sshd, **{"lambda": {"launch_interval": 0.6}})
        backend = adapter(cfg, store)
        with capture_logs() as logs:
            async with asyncio.timeout(30):
                for label in ("one", "two"):  # the second launch waits for the launch pace
                    offer = (await backend.search_offers(H100))[0]
                    handle = await backend.provision(offer, 64, "img:1", sshd.user_key.public,
                                                     label)
                    await backend.teardown(handle)
        assert cloud.rate_limited() == 0
        assert cloud.live() == []
    waits = [e for e in logs if e["event"] == "launch_api_waiting"]
    assert [e["path"] for e in waits] == ["/api/v1/instance-operations/launch"]
    assert waits[0]["reason"] == "pace"


async def test_teardown_is_idempotent_and_confirmed(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """A running instance is reached over SSH with the key its provider installed; teardown
    waits until the provider no longer has it, and a second teardown only warns."""
    backend = adapter(launch_config(tmp_path, cloud, sshd), store)
    with capture_logs() as logs:
        async with asyncio.timeout(40):
            offer = (await backend.search_offers(H100))[0]
            handle = await backend.provision(offer, 64, "img:1", sshd.user_key.public, "ct")
            assert (await backend.status(handle)).state is HostState.LOADING
            handle = await backend.wait_running(handle, 10)
            lines: list[str] = []
            result = await backend.run_remote(handle, ["echo", "on", cloud.name],
                                              stream=lines.append, timeout=20)
            assert (result.exit_code, lines) == (0, [f"on {cloud.name}"])
            await backend.teardown(handle)
            await backend.teardown(handle)
            assert (await backend.status(handle)).state is HostState.DESTROYED
    assert sshd.user_key.public in (sshd.root / "authorized_keys").read_text()
    assert cloud.live() == []
    gone = [e for e in logs if e["event"] == "launch_teardown_already_gone"]
    assert len(gone) == 1
    assert gone[0]["log_level"] == "warning"


@pytest.mark.timeout(240)
async def test_launch_life_cycle(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """``traind launch`` rents an instance from the stand-in, syncs, installs and starts traind
    on it, follows a tiny TRL run to its end; ``launch pull`` brings the newest checkpoint
    home and ``launch down`` destroys the instance, leaving nothing billed."""
    need_binary("rsync")
    need_module("trl")
    launch_toml = project(tmp_path, max_steps=2,
                          backend_toml=backend_toml(cloud, sshd.user_key.path))
    env = {**os.environ, **cloud.env}
    launcher = Launcher("-c", str(launch_toml), env=env)
    try:
        assert await asyncio.to_thread(launcher.wait, 200) == 0, launcher.tail()
        assert any(committed(line, 2) for line in launcher.out)
        assert "tiny: finished" in launcher.err
        steps = [e["step"] for e in launcher.events() if e.get("event") == "launch_step"]
        assert steps == ["search", "provision", "wait_running", "connect", "prepare",
                         "sync_code", "sync_traind", "install", "start"]
        assert cloud.live() != []
        pull = Launcher("pull", "tiny", env=env)
        assert await asyncio.to_thread(pull.wait, 60) == 0, pull.tail()
        pulled = tmp_path / "pulled/tiny/checkpoint-2"
        assert json.loads((pulled / "trainer_state.json").read_text())["global_step"] == 2
        down = Launcher("down", "tiny", "--no-pull", env=env)
        assert await asyncio.to_thread(down.wait, 60) == 0, down.tail()
        assert cloud.live() == []
        assert store.names() == []
        secrets = list(cloud.env.values())
        logged = "\n".join(launcher.err + pull.err + down.err)
        assert not any(s in logged for s in secrets)
    finally:
        launcher.kill()
        kill_traind(tmp_path / "remote")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cloud", ["runpod"], indirect=True)
async def test_a_run_outlives_two_killed_hosts(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """A host whose traind is killed mid-training (twice, its disk wiped as a new host's would
    be) is destroyed and replaced; each new one restores the newest committed checkpoint, the
    run ends with exit 0, no step trained more than once again, nothing left billed."""
    need_binary("rsync")
    need_module("trl")
    remote = tmp_path / "remote"
    launch_toml = project(tmp_path, max_steps=10,
                          backend_toml=backend_toml(cloud, sshd.user_key.path))
    resuming(tmp_path)
    launcher = Launcher("-c", str(launch_toml), env={**os.environ, **cloud.env})

    async def killed() -> None:
        kill_traind(remote)

    try:
        recovered = await outlive(launcher, remote, [("killed host", killed)] * 2)
        for recovery in recovered:
            print(recovery.row(cloud.name))
        assert cloud.created() == 3
        assert len(cloud.live()) == 1  # the last host, kept (on_finish = "keep")
    finally:
        launcher.kill()
        kill_traind(remote)


def _followed_project(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, bound: str, max_steps: int = 10
) -> Path:
    """A resumable tiny run on ``cloud`` whose [host] unreachable_after is ``bound``."""
    launch_toml = project(tmp_path, max_steps=max_steps,
                          backend_toml=backend_toml(cloud, sshd.user_key.path))
    launch_toml.write_text(launch_toml.read_text().replace(
        'wait_running = "20s"\n', f'wait_running = "20s"\nunreachable_after = "{bound}"\n'))
    config = tmp_path / "project" / "traind.toml"
    config.write_text(config.read_text().replace('"--step-sleep"', '"--resume", "--step-sleep"'))
    return launch_toml


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("cloud", ["runpod"], indirect=True)
async def test_a_host_unreachable_past_the_bound_is_destroyed_and_replaced(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """A host whose SSH stops answering (its sshd and traind gone) while RunPod still lists
    it running is, after [host] unreachable_after, destroyed (RunPod no longer lists it) and
    replaced; the run restores the newest commit and ends with exit 0, a few steps lost, and
    ``launch status`` names the reason."""
    need_binary("rsync")
    need_module("trl")
    remote = tmp_path / "remote"
    first = SSHServer(need_binary("sshd"), tmp_path / "sshd-first")
    (first.root / "authorized_keys").write_text(sshd.user_key.public + "\n")
    await first.start()
    cloud.host.port = first.port  # the first pod's SSH is this sshd; later pods' the shared one
    env = {**os.environ, **cloud.env}
    launcher = Launcher("-c", str(_followed_project(tmp_path, cloud, sshd, "6s")), env=env)
    trained: list[int] = []
    try:
        await asyncio.to_thread(launcher.wait_out, lambda ln: committed(ln, 3), 300)
        [dead] = cloud.live()
        await first.stop()  # the host vanishes: its SSH does not answer...
        kill_traind(remote)  # ...and nothing on it runs; RunPod still lists it RUNNING
        cloud.host.port = sshd.port
        trained += trained_steps(remote / "state")
        shutil.rmtree(remote / "out")
        shutil.rmtree(remote / "state")
        assert await asyncio.to_thread(launcher.wait, 300) == 0, launcher.tail()
        trained += trained_steps(remote / "state")
        events = launcher.events()
        [lost] = [e for e in events if e.get("event") == "launch_host_unreachable"]
        [too_long] = [e for e in events if e.get("event") == "launch_host_unreachable_too_long"]
        [recovered] = [e for e in events if e.get("event") == "launch_recovered"]
        counts = {s: trained.count(s) for s in set(trained)}
        print(f"unreachable: seen {_at(lost):.3f}, given up after {too_long['seconds']}s, next "
              f"host running {_at(recovered) - _at(lost):.1f}s after it was lost; recovery "
              f"from {recovered['checkpoint']}, steps_lost={recovered['steps_lost']}; "
              f"step trainings: {counts}")
        assert 6 <= too_long["seconds"] < 20
        assert recovered["state"] == "unreachable"
        assert str(recovered["message"]).startswith("unreachable for ")
        assert "lists it running" in str(recovered["message"])
        assert recovered["from_instance"] == dead
        assert dead in cloud.fake.deleted
        assert dead not in cloud.live()
        assert cloud.created() == 2
        retrained = sum(n == 2 for n in counts.values())  # since the newest commit
        assert isinstance(recovered["steps_lost"], int)
        assert 0 <= recovered["steps_lost"] <= retrained
        assert set(range(1, 11)) <= set(counts), counts
        assert all(n <= 2 for n in counts.values()), counts
        status = Launcher("status", "tiny", env=env)
        assert await asyncio.to_thread(status.wait, 60) == 0, status.tail()
        assert any("unreachable (unreachable for " in line for line in status.out), status.out
        down = Launcher("down", "tiny", "--no-pull", env=env)
        assert await asyncio.to_thread(down.wait, 60) == 0, down.tail()
        assert cloud.live() == []
    finally:
        launcher.kill()
        kill_traind(remote)
        await first.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cloud", ["runpod"], indirect=True)
async def test_a_blip_shorter_than_the_bound_changes_nothing(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """A host whose SSH is down for a few seconds, less than [host] unreachable_after, is
    followed on once it answers: the run ends with exit 0 on the one host, no recovery."""
    need_binary("rsync")
    need_module("trl")
    remote = tmp_path / "remote"
    env = {**os.environ, **cloud.env}
    # 20 steps: the run is still training when the blip ends (lines logged during a blip
    # are not shown once following goes on)
    launch_toml = _followed_project(tmp_path, cloud, sshd, "60s", max_steps=20)
    launcher = Launcher("-c", str(launch_toml), env=env)
    try:
        await asyncio.to_thread(launcher.wait_out, lambda ln: committed(ln, 2), 200)
        await sshd.stop()  # every connection cut, nothing answers for ~3 s
        await asyncio.sleep(3)
        await sshd.start()
        assert await asyncio.to_thread(launcher.wait, 200) == 0, launcher.tail()
        events = [e.get("event") for e in launcher.events()]
        assert "launch_host_unreachable" in events
        assert "launch_host_reachable_again" in events
        assert "launch_host_unreachable_too_long" not in events
        assert "launch_recovered" not in events
        assert cloud.created() == 1
        assert any(committed(line, 20) for line in launcher.out)
    finally:
        launcher.kill()
        kill_traind(remote)
        await sshd.start()


def _traind_exited(remote: Path) -> bool:
    """Whether the launched traind's process is gone (its pid file names no live process)."""
    for pidfile in (remote / "launches").glob("*/traind.pid"):
        try:
            os.kill(int(pidfile.read_text()), 0)
        except (ValueError, OSError):
            continue
        return False
    return True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cloud", ["runpod"], indirect=True)
async def test_a_run_that_finished_during_a_blip_is_finished(
    tmp_path: Path, cloud: Cloud, sshd: SSHServer, store: LaunchStore
) -> None:
    """A run that completes while the host's SSH is down (its run_complete never followed)
    is seen finished once the host answers again: exit 0, no recovery, one host."""
    need_binary("rsync")
    need_module("trl")
    remote = tmp_path / "remote"
    env = {**os.environ, **cloud.env}
    launcher = Launcher("-c", str(_followed_project(tmp_path, cloud, sshd, "120s", 4)),
                        env=env)
    try:
        await asyncio.to_thread(launcher.wait_out, lambda ln: committed(ln, 1), 200)
        await sshd.stop()
        await poll_until(lambda: asyncio.to_thread(_traind_exited, remote), within=120,
                         every=0.5)
        assert _traind_exited(remote), "traind did not finish while SSH was down"
        await sshd.start()
        assert await asyncio.to_thread(launcher.wait, 200) == 0, launcher.tail()
        events = [e.get("event") for e in launcher.events()]
        assert "launch_host_reachable_again" in events
        assert "launch_recovering" not in events
        assert cloud.created() == 1
    finally:
        launcher.kill()
        kill_traind(remote)
        await sshd.start()

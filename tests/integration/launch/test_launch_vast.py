"""The ``vast`` adapter against a stand-in for vast.ai's REST API: search, loading → running,
refusals, vanishing instances, 5xx, idempotent teardown, and what a failed launch leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vast import API_KEY, FakeVast, RunningFakeVast
from tests.support.net import free_port
from tests.support.requires import need_binary
from tests.support.sshd import SSHServer, keygen
from traind.launch.commands import flow, manage
from traind.launch.providers.vast.adapter import VastBackend

from traind.launch.base import Constraints, HostState
from traind.launch.config import LaunchConfig, VastSection, load
from traind.launch.errors import (
    BackendAPIError,
    HostUnreachableError,
    InstanceNotFoundError,
    NoOffersError,
    ProvisionError,
)
from traind.launch.handles import LaunchStore

pytestmark = pytest.mark.timeout(60)
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFakeFakeFakeFakeFakeFakeFakeFakeFake t"
RTX = Constraints(gpu=("RTX_4090",), min_reliability=0.95, min_disk_gb=50,
                  min_download_mbps=100, duration_hours=24, max_price_per_hour=0.5)


@pytest.fixture
async def fake() -> AsyncIterator[FakeVast]:
    """A stand-in vast.ai whose instances' SSH port is closed."""
    server = FakeVast(ssh_port=free_port())
    async with RunningFakeVast(server):
        yield server


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LaunchStore:
    """Launch records under tmp_path."""
    monkeypatch.setenv("TRAIND_LAUNCH_STATE", str(tmp_path / "state"))
    return LaunchStore()


def section(fake: FakeVast, **kw: Any) -> VastSection:
    values: dict[str, Any] = {
        "api_key": API_KEY, "url": fake.url, "poll_interval": 0.02,
        "retries": 2, "backoff_initial": 0.01, "backoff_max": 0.02, "request_timeout": 5,
    }
    return VastSection(**(values | kw))


@pytest.fixture
def backend(fake: FakeVast, store: LaunchStore, tmp_path: Path) -> VastBackend:
    """The adapter pointed at the stand-in."""
    return VastBackend(section(fake), store, tmp_path / "id_ed25519")


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Every structlog event of the test."""
    with capture_logs() as captured:
        yield captured


def launch_config(tmp_path: Path, fake: FakeVast, **sections: Any) -> LaunchConfig:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('train')\n")
    (tmp_path / "traind.toml").write_text("[run]\nname = 'x'\n")
    (tmp_path / "id_ed25519").write_text("not a real key\n")
    (tmp_path / "id_ed25519.pub").write_text(PUBLIC_KEY + "\n")
    data: dict[str, Any] = {
        "name": "vt", "backend": "vast",
        "run": {"code_dir": "code", "traind_config": "traind.toml"},
        "constraints": {"gpu": "RTX 4090", "min_reliability": 0.95},
        "host": {"ssh_key": "id_ed25519", "wait_running": "1s", "image": "img:1", "disk_gb": 64},
        "vast": section(fake).model_dump() | {"api_key": API_KEY},
    }
    for key, value in sections.items():
        data[key] = data.get(key, {}) | value
    return LaunchConfig.model_validate(data, context={"base": tmp_path})


async def test_search_filters_and_ranks(
    backend: VastBackend, fake: FakeVast, logs: list[dict[str, Any]]
) -> None:
    """Search sends the constraints as filters with the key as a Bearer token, re-checks them
    locally and returns the fitting offers cheapest first with their raw records; the key is
    never logged."""
    fake.server_errors["GET"] = 1
    async with asyncio.timeout(10):
        offers = await backend.search_offers(RTX)
    assert [o.id for o in offers] == ["101", "108"]  # same price: the more reliable first
    assert offers[0].raw["machine_id"] == 1101
    assert offers[0].gpu_ram_gb == pytest.approx(24564 / 1024)
    assert offers[0].max_duration_hours == pytest.approx(720)
    q = fake.queries[-1]
    assert q["gpu_name"] == {"in": ["RTX 4090"]}
    assert q["dph_total"] == {"lte": 0.5}
    assert q["rentable"] == {"eq": True}
    assert [e["event"] for e in logs] == ["launch_api_retry", "launch_offers"]  # 503 retried
    assert API_KEY not in repr(logs)


async def test_search_without_matches_is_no_offers(
    tmp_path: Path, fake: FakeVast, store: LaunchStore, backend: VastBackend
) -> None:
    """No matching offer: NoOffersError, nothing created, nothing saved."""
    cfg = launch_config(tmp_path, fake, constraints={"gpu": "B200"})
    ctx = flow.Context(cfg, backend, store)
    async with asyncio.timeout(10):
        with pytest.raises(NoOffersError):
            await flow.launch(ctx, tmp_path / "launch.toml")
    assert not fake.instances
    assert not [r for r in fake.requests if r[0] == "PUT"]
    assert store.names() == []


async def test_provision_goes_loading_then_running(backend: VastBackend, fake: FakeVast) -> None:
    """A created instance reports loading, then running with an SSH endpoint; our key is
    attached, and status reports GPU, uptime and endpoint."""
    offer = (await backend.search_offers(RTX))[0]
    async with asyncio.timeout(10):
        handle = await backend.provision(offer, 64, "img:1", PUBLIC_KEY, "vt")
        assert (await backend.status(handle)).state is HostState.LOADING
        running = await backend.wait_running(handle, timeout=5)
    instance = fake.instances[int(handle.instance_id)]
    assert instance.body == {"client_id": "me", "image": "img:1", "disk": 64, "label": "vt",
                             "runtype": "ssh"}
    assert instance.ssh_keys == [PUBLIC_KEY]
    assert running.endpoint is not None
    assert (running.endpoint.host, running.endpoint.port) == ("127.0.0.1", fake.ssh_port)
    assert running.endpoint.user == "root"
    status = await backend.status(running)
    assert status.state is HostState.RUNNING
    assert (status.gpu_name, status.num_gpus) == ("RTX 4090", 1)
    assert status.uptime_seconds is not None
    assert status.uptime_seconds >= 0


async def test_provision_refused(backend: VastBackend, fake: FakeVast) -> None:
    """A refused create is a ProvisionError carrying the API's message."""
    fake.refuse_create = "insufficient credit"
    offer = (await backend.search_offers(RTX))[0]
    async with asyncio.timeout(10):
        with pytest.raises(ProvisionError, match="insufficient credit"):
            await backend.provision(offer, 64, "img:1", PUBLIC_KEY, "vt")
    assert not fake.instances


async def test_lost_create_answer_finds_the_instance_by_label(
    backend: VastBackend, fake: FakeVast
) -> None:
    """A create whose answer is a 500 is not retried (no double rental); the instance it may
    have made is found by label and returned, so it can be torn down."""
    fake.create_then_fail = True
    offer = (await backend.search_offers(RTX))[0]
    async with asyncio.timeout(10):
        handle = await backend.provision(offer, 64, "img:1", PUBLIC_KEY, "vt")
    assert [int(handle.instance_id)] == list(fake.instances)
    assert [r for r in fake.requests if r[0] == "PUT"] == [("PUT", f"/api/v0/asks/{offer.id}/")]


async def test_instance_vanishing_while_waiting(backend: VastBackend, fake: FakeVast) -> None:
    """An instance that disappears while loading is InstanceNotFoundError; its status is then
    DESTROYED."""
    fake.vanish_after_polls = 1
    offer = (await backend.search_offers(RTX))[0]
    async with asyncio.timeout(10):
        handle = await backend.provision(offer, 64, "img:1", PUBLIC_KEY, "vt")
        with pytest.raises(InstanceNotFoundError):
            await backend.wait_running(handle, timeout=5)
        assert (await backend.status(handle)).state is HostState.DESTROYED


async def test_stuck_loading_times_out(backend: VastBackend, fake: FakeVast) -> None:
    """An instance that never leaves loading is a ProvisionError after the timeout."""
    fake.stuck_loading = True
    offer = (await backend.search_offers(RTX))[0]
    async with asyncio.timeout(10):
        handle = await backend.provision(offer, 64, "img:1", PUBLIC_KEY, "vt")
        with pytest.raises(ProvisionError, match="not running after"):
            await backend.wait_running(handle, timeout=0.3)


async def test_persistent_5xx_is_a_backend_error(backend: VastBackend, fake: FakeVast) -> None:
    """5xx answers are retried a bounded number of times, then BackendAPIError."""
    fake.server_errors["GET"] = 100
    async with asyncio.timeout(10):
        with pytest.raises(BackendAPIError, match="503"):
            await backend.search_offers(RTX)
    assert len(fake.requests) == 3  # the first try and two retries


async def test_teardown_is_idempotent(
    backend: VastBackend, fake: FakeVast, logs: list[dict[str, Any]]
) -> None:
    """Destroying twice succeeds twice; the second time warns that it was already gone."""
    offer = (await backend.search_offers(RTX))[0]
    async with asyncio.timeout(10):
        handle = await backend.provision(offer, 64, "img:1", PUBLIC_KEY, "vt")
        await backend.teardown(handle)
        await backend.teardown(handle)
        assert (await backend.status(handle)).state is HostState.DESTROYED
    assert fake.destroyed == [int(handle.instance_id)]
    gone = [e for e in logs if e["event"] == "launch_teardown_already_gone"]
    assert len(gone) == 1
    assert gone[0]["log_level"] == "warning"


async def test_failure_after_provisioning_tears_down(
    tmp_path: Path, fake: FakeVast, store: LaunchStore, backend: VastBackend,
    logs: list[dict[str, Any]],
) -> None:
    """The instance runs but SSH never answers: the launch fails, the instance is destroyed
    and the launch forgotten; every step was logged with its timing."""
    ctx = flow.Context(launch_config(tmp_path, fake), backend, store)
    async with asyncio.timeout(20):
        with pytest.raises(HostUnreachableError):
            await flow.launch(ctx, tmp_path / "launch.toml")
    assert fake.destroyed == [5001]
    assert not fake.instances
    assert store.names() == []
    steps = [(e["step"], "seconds" in e) for e in logs if e["event"] == "launch_step"]
    assert steps == [("search", True), ("provision", True), ("wait_running", True)]
    assert [e["step"] for e in logs if e["event"] == "launch_step_failed"] == ["connect"]
    assert any(e["event"] == "launch_failed_torn_down" for e in logs)


async def test_failure_with_keep_reports_the_down_command(
    tmp_path: Path, fake: FakeVast, store: LaunchStore, backend: VastBackend,
    logs: list[dict[str, Any]],
) -> None:
    """With on_failure = "keep", a failed launch keeps the instance and the record, and says
    how to destroy it."""
    cfg = launch_config(tmp_path, fake, host={"on_failure": "keep"})
    ctx = flow.Context(cfg, backend, store)
    async with asyncio.timeout(20):
        with pytest.raises(HostUnreachableError):
            await flow.launch(ctx, tmp_path / "launch.toml")
    assert fake.destroyed == []
    assert store.names() == ["vt"]
    kept = [e for e in logs if e["event"] == "launch_failed_host_kept"]
    assert kept[0]["destroy_with"] == "traind launch down vt --no-pull"
    assert kept[0]["instance"] == "5001"
    async with asyncio.timeout(20):
        assert await manage.down(ctx, store.load("vt"), pull_first=False) is None
    assert fake.destroyed == [5001]
    assert store.names() == []


async def test_failed_teardown_is_loud(
    tmp_path: Path, fake: FakeVast, store: LaunchStore, backend: VastBackend,
    logs: list[dict[str, Any]],
) -> None:
    """When the teardown after a failure fails too (the API keeps answering 503), the launch
    stays saved and a critical event names the instance and the command that removes it."""
    cfg = launch_config(tmp_path, fake)
    ctx = flow.Context(cfg, backend, store)
    fake.server_errors["DELETE"] = 100
    async with asyncio.timeout(20):
        with pytest.raises(HostUnreachableError):
            await flow.launch(ctx, tmp_path / "launch.toml")
    assert list(fake.instances) == [5001]
    assert store.names() == ["vt"]
    loud = [e for e in logs if e["event"] == "launch_failed_host_left_running"]
    assert loud[0]["log_level"] == "critical"
    assert loud[0]["destroy_with"] == "traind launch down vt --no-pull"
    assert "503" in loud[0]["teardown_error"]


async def test_instance_host_key_is_trusted_on_first_use_then_pinned(
    tmp_path: Path, fake: FakeVast, store: LaunchStore
) -> None:
    """Commands reach the instance over SSH after its host key is recorded on first use;
    a different key presented later is refused."""
    sshd = SSHServer(need_binary("sshd"), tmp_path / "sshd")
    await sshd.start()
    try:
        fake.ssh_port = sshd.port
        fake.loading_polls = 0
        vast = VastBackend(section(fake, ssh_user=sshd.user), store, sshd.user_key.path)
        offer = (await vast.search_offers(RTX))[0]
        async with asyncio.timeout(30):
            handle = await vast.wait_running(
                await vast.provision(offer, 64, "img:1", PUBLIC_KEY, "vt"), timeout=5
            )
            lines: list[str] = []
            result = await vast.run_remote(handle, ["echo", "hello from", "vast"],
                                           stream=lines.append, timeout=20)
        assert (result.exit_code, lines) == (0, ["hello from vast"])
        recorded = store.known_hosts("vt").read_text()
        assert sshd.host_key.public.split()[1] in recorded
        other = keygen(tmp_path / "other_host_key").public.split()[1]
        store.known_hosts("vt").write_text(recorded.replace(sshd.host_key.public.split()[1], other))
        async with asyncio.timeout(30):
            with pytest.raises(HostUnreachableError, match="host key"):
                await vast.run_remote(handle, "true", timeout=20)
    finally:
        await sshd.stop()


def test_api_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without api_key in the file, $VAST_API_KEY is used; it never shows in the config's repr."""
    monkeypatch.setenv("VAST_API_KEY", "from-env-123")
    cfg = VastSection()
    assert cfg.key().get_secret_value() == "from-env-123"
    assert "secret-456" not in repr(VastSection(api_key="secret-456"))


def test_example_launch_toml_loads() -> None:
    """config/launch.toml (the commented example) is a valid vast launch."""
    cfg = load(Path(__file__).parents[3] / "config" / "launch.toml")
    assert cfg.backend == "vast"
    assert cfg.constraints.to_constraints().max_price_per_hour == 0.6
    assert cfg.ssh.hosts[0].name == "gpu-box-1"

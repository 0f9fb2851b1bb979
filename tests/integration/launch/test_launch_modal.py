"""``backend = "modal"`` against the Modal stand-in (tests/support/fake_modal.py), with the
real ``modal`` client over gRPC: the whole life cycle with a real ``traind run`` and a tiny TRL
run, each bad input with its clear error, and nothing left running in Modal's listing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.integration.launch.lifecycle import (
    Launcher,
    committed,
    outlive,
    project,
    resuming,
    status_pull_down,
    trainer_pids,
)
from tests.support.requires import need_module

from traind.launch.commands import jobflow
from traind.launch.commands.flow import log_event
from traind.launch.config import LaunchConfig, ModalSection
from traind.launch.errors import BackendAPIError, ProvisionError
from traind.launch.handles import LaunchStore
from traind.launch.jobs import LABEL
from traind.launch.registry import open_job_backend
from traind.util.poll import poll_until

if TYPE_CHECKING:
    from tests.support.fake_modal import FakeModal

pytestmark = pytest.mark.timeout(60)
FAST = {"poll_interval": 0.1, "cancel_timeout": 20}


@pytest.fixture
async def modal_fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FakeModal, str]]:
    """The stand-in on loopback, the client pointed at it with its token (no config file),
    and modal's per-process client forgotten around each test (each has its own loop)."""
    need_module("modal")
    import modal.client
    from tests.support.fake_modal import TOKEN_ID, TOKEN_SECRET, FakeModal

    fake = FakeModal(grace=5)
    url = await fake.start()
    monkeypatch.setenv("MODAL_SERVER_URL", url)
    monkeypatch.setenv("MODAL_TOKEN_ID", TOKEN_ID)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", TOKEN_SECRET)
    monkeypatch.setenv("MODAL_CONFIG_PATH", "/nonexistent/.modal.toml")
    modal.client._Client._set_env_client(None)
    try:
        yield fake, url
    finally:
        modal.client._Client._set_env_client(None)
        await fake.stop()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LaunchStore:
    """Launch records under tmp_path."""
    monkeypatch.setenv("TRAIND_LAUNCH_STATE", str(tmp_path / "state"))
    return LaunchStore()


def context(tmp_path: Path, store: LaunchStore, **table: Any) -> jobflow.Context:
    """A job launch whose traind config is a real one (a local store, no trainer)."""
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "traind.toml").write_text(
        f'[run]\nname = "x"\noutput_dir = "{tmp_path}/out"\nstate_dir = "{tmp_path}/st"\n'
        f'[storage]\ntype = "local"\npath = "{tmp_path}/store"\n[status]\nenabled = false\n')
    cfg = LaunchConfig.model_validate({
        "name": "md", "backend": "modal",
        "run": {"code_dir": "code", "traind_config": "traind.toml"},
        "host": {"wait_running": "20s"},
        "modal": {"image": "img:1", "gpu": "T4", **FAST, **table},
    }, context={"base": tmp_path})
    return jobflow.Context(cfg, open_job_backend(cfg), store)


async def launched(ctx: jobflow.Context, tmp_path: Path) -> None:
    """``jobflow.launch``, bounded."""
    async with asyncio.timeout(30):
        await jobflow.launch(ctx, tmp_path / "l.toml")


async def test_wrong_or_missing_token_is_named(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong token is Modal's UNAUTHENTICATED, a missing one is said before any call; the
    secret is never printed and no sandbox exists."""
    fake, _ = modal_fake
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-wrong-secret")
    with pytest.raises(ProvisionError, match="refused the token") as wrong:
        await launched(context(tmp_path, store), tmp_path)
    assert "as-wrong-secret" not in str(wrong.value)
    assert fake.calls, "the token was sent and refused"
    monkeypatch.delenv("MODAL_TOKEN_ID")
    monkeypatch.delenv("MODAL_TOKEN_SECRET")
    import modal.client
    modal.client._Client._set_env_client(None)
    calls = len(fake.calls)
    with pytest.raises(ProvisionError, match="Token missing"):
        await launched(context(tmp_path, store), tmp_path)
    assert len(fake.calls) == calls
    assert fake.sandboxes == {}
    assert store.names() == []


async def test_unknown_gpu_is_refused_by_name(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """An unknown GPU is Modal's INVALID_ARGUMENT naming it; nothing runs."""
    fake, _ = modal_fake
    with pytest.raises(ProvisionError, match=r"refused it as asked.*Unknown GPU type: X100"):
        await launched(context(tmp_path, store, gpu="X100:2"), tmp_path)
    assert fake.sandboxes == {}
    assert store.names() == []


async def test_quota_refusal_is_named(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """RESOURCE_EXHAUSTED on create says it is a quota, with Modal's words; nothing runs."""
    from grpclib.const import Status

    fake, _ = modal_fake
    fake.refuse_create = (Status.RESOURCE_EXHAUSTED, "GPU quota of the workspace reached")
    with pytest.raises(ProvisionError, match=r"quota.*GPU quota of the workspace reached"):
        await launched(context(tmp_path, store), tmp_path)
    assert fake.sandboxes == {}
    assert store.names() == []


async def test_image_that_does_not_exist_is_named(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """An image Modal cannot pull fails its build: the launch fails naming it, no sandbox."""
    fake, _ = modal_fake
    fake.missing_images.add("nope:1")
    with pytest.raises(ProvisionError, match=r"build the image.*nope:1: manifest unknown"):
        await launched(context(tmp_path, store, image="nope:1"), tmp_path)
    assert fake.sandboxes == {}
    assert store.names() == []


async def test_unavailable_is_retried_by_the_client_then_named(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """A passing UNAVAILABLE is retried by modal's client (one sandbox, `down` ends it); one
    that lasts is a BackendAPIError and nothing runs."""
    fake, _ = modal_fake
    fake.fail_next = {"SandboxCreate": 1, "SandboxWait": 1}
    ctx = context(tmp_path, store)
    async with asyncio.timeout(40):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        assert len(fake.sandboxes) == 1
        assert fake.live() != []
        await jobflow.down(ctx, record, pull_first=False)
    assert fake.live() == []
    fake.fail_next = {"SandboxCreate": 99}
    with pytest.raises(BackendAPIError, match="upstream connect error"):
        async with asyncio.timeout(60):
            await jobflow.launch(ctx, tmp_path / "l.toml")
    assert len(fake.sandboxes) == 1
    assert fake.live() == []


async def test_sandbox_ended_at_its_timeout_is_reported_as_timeout(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """A sandbox Modal ends at its timeout is timeout: following it says so, nothing runs."""
    fake, _ = modal_fake
    ctx = context(tmp_path, store, timeout="3s")
    async with asyncio.timeout(40):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        outcome = await jobflow.follow(ctx, record, asyncio.Event(), lambda _: None)
        facts = await jobflow.status(ctx, record)
    assert (outcome, facts["state"]) == ("timeout", "timeout")
    assert fake.live() == []


async def test_a_launch_without_gpu_is_a_v2_sandbox(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """With no GPU the client makes a V2 sandbox (SandboxCreateV2): it runs, its stdout comes
    through the task's command router, ``down`` terminates it (SandboxTerminateV2) and Modal's
    listing shows nothing of it."""
    fake, _ = modal_fake
    ctx = context(tmp_path, store, gpu="")
    async with asyncio.timeout(60):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        (box,) = fake.sandboxes.values()

        async def said() -> bytes:
            return fake.stdout(box)

        assert await poll_until(said, within=30, every=0.2)
        lines = [line async for line in ctx.backend.logs(record.handle, follow=False)]
        assert await listed("md") == [box.id]
        await jobflow.down(ctx, record, pull_first=False)
        assert await listed("md") == []
    assert box.v2
    assert not box.definition.resources.gpu_config.gpu_type
    assert "SandboxCreate" not in fake.calls
    assert {"SandboxCreateV2", "SandboxStdioReadV2", "SandboxTerminateV2"} <= set(fake.calls)
    assert any(log_event(line) for line in lines), lines
    assert "TRAIND_CONFIG_TOML" in box.env
    assert fake.live() == []


async def listed(label: str) -> list[str]:
    """The sandboxes of launch ``label`` Modal lists as running in the launches' app
    (SandboxListV2, through the client)."""
    import modal

    app = await modal.App.lookup.aio(ModalSection.model_fields["app"].default)
    return [sb.object_id async for sb in modal.Sandbox.list.aio(app_id=app.app_id,
                                                                tags={LABEL: label})]


def modal_env(url: str) -> dict[str, str]:
    """The launcher's environment: the client pointed at the stand-in."""
    return {**os.environ, "MODAL_SERVER_URL": url}


@pytest.mark.timeout(240)
async def test_modal_life_cycle(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """``traind launch`` creates a sandbox running ``traind run`` (config as a secret), follows
    its stdout to the end of a tiny TRL run; ``status`` says completed with the last commit,
    ``pull`` brings the newest checkpoint from the store, ``down`` leaves nothing."""
    need_module("trl")
    from tests.support.fake_modal import TOKEN_SECRET

    fake, url = modal_fake
    launch_toml = project(tmp_path, max_steps=2, backend_toml=(
        'backend = "modal"\n\n[modal]\nimage = "traind:test"\ngpu = "A100-80GB:2"\n'
        'timeout = "200s"\npoll_interval = "200ms"\nlabels = { team = "ml" }\n'))
    env = modal_env(url)
    launcher = Launcher("-c", str(launch_toml), env=env)
    try:
        assert await asyncio.to_thread(launcher.wait, 200) == 0, launcher.tail()
        assert any(committed(line, 2) for line in launcher.out)
        (box,) = fake.sandboxes.values()
        assert box.tags == {"team": "ml", "traind-launch": "tiny"}
        gpu = box.definition.resources.gpu_config
        assert (gpu.gpu_type, gpu.count, box.definition.timeout_secs) == ("A100-80GB", 2, 200)
        assert "TRAIND_CONFIG_TOML" in box.env
        facts, said = await status_pull_down(tmp_path, env)
        assert facts["instance"] == box.id
        assert fake.live() == []
        assert store.names() == []
        assert TOKEN_SECRET not in "\n".join(launcher.err + launcher.out + said)
    finally:
        launcher.kill()


@pytest.mark.timeout(240)
async def test_down_terminates_a_running_sandbox(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """``launch --detach`` leaves the sandbox training; ``logs`` shows its stdout; ``down
    --no-pull`` terminates it: Modal lists nothing running, the trainer's processes are gone."""
    need_module("trl")
    fake, url = modal_fake
    launch_toml = project(tmp_path, max_steps=200, backend_toml=(
        'backend = "modal"\n\n[modal]\nimage = "traind:test"\ngpu = "H100"\n'
        'poll_interval = "200ms"\n'))
    env = modal_env(url)
    launcher = Launcher("-c", str(launch_toml), "--detach", env=env)

    async def probe() -> list[int]:
        return trainer_pids(tmp_path / "remote/out")

    try:
        assert await asyncio.to_thread(launcher.wait, 60) == 0, launcher.tail()
        assert fake.live() != []
        assert await poll_until(probe, within=120, every=0.2), launcher.tail()
        logs = Launcher("logs", "tiny", env=env)
        assert await asyncio.to_thread(logs.wait, 60) == 0, logs.tail()
        assert logs.out
        down = Launcher("down", "tiny", "--no-pull", env=env)
        assert await asyncio.to_thread(down.wait, 90) == 0, down.tail()
        assert fake.live() == []
        assert store.names() == []
        assert not await poll_until(probe, done=lambda pids: not pids, within=20, every=0.2)
    finally:
        launcher.kill()


@pytest.mark.timeout(420)
async def test_a_run_outlives_a_preempted_and_a_timed_out_sandbox(
    tmp_path: Path, modal_fake: tuple[FakeModal, str], store: LaunchStore
) -> None:
    """A sandbox preempted (SIGINT, SIGKILL after the grace) and one ended at its timeout
    mid-training are replaced: each next one restores the newest committed checkpoint, the run
    ends with the trainer's exit 0, no step trained more than once again, Modal lists nothing
    running."""
    need_module("trl")
    fake, url = modal_fake
    fake.scheduling = 3.0  # the test wipes the ended sandbox's disk before the next one starts
    launch_toml = project(tmp_path, max_steps=10, backend_toml=(
        'backend = "modal"\n\n[modal]\nimage = "traind:test"\ngpu = "A10G"\n'
        'poll_interval = "200ms"\n'))
    resuming(tmp_path)
    launcher = Launcher("-c", str(launch_toml), env=modal_env(url))

    def ending(end: Callable[[str], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def ended() -> None:
            (box_id,) = await listed("tiny")
            await end(box_id)
            gone = await poll_until(lambda: listed("tiny"), done=lambda ids: box_id not in ids,
                                    within=30, every=0.2)
            assert box_id not in gone
        return ended

    try:
        recovered = await outlive(launcher, tmp_path / "remote", [
            ("preemption", ending(fake.preempt)), ("timeout", ending(fake.time_out))])
        for recovery in recovered:
            print(recovery.row("modal"))
        assert len(fake.sandboxes) == 3
        assert await listed("tiny") == []
    finally:
        launcher.kill()

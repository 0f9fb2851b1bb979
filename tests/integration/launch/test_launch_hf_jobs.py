"""``backend = "hf-jobs"`` against the HF Jobs stand-in (tests/support/fake_hf_jobs.py), with
the real huggingface_hub: the whole life cycle with a real ``traind run`` and a tiny TRL run,
each bad input with its clear error, and nothing left running in the platform's listing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
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
from tests.support.fake_cloud import Serving
from tests.support.fake_hf_jobs import NAMESPACE, TOKEN, FakeHFJobs
from tests.support.requires import need_module

from traind.launch.commands import jobflow
from traind.launch.commands.flow import log_event
from traind.launch.errors import BackendAPIError, LaunchError, ProvisionError
from traind.launch.handles import LaunchStore
from traind.launch.registry import open_job_backend
from traind.util.poll import poll_until

pytestmark = pytest.mark.timeout(60)
FAST = {"poll_interval": 0.1, "retries": 2, "backoff_initial": 0.05, "backoff_max": 0.1,
        "cancel_timeout": 20}


@pytest.fixture
async def hf() -> AsyncIterator[tuple[FakeHFJobs, str]]:
    """The stand-in on loopback, and its URL."""
    fake = FakeHFJobs(grace=5)
    async with Serving(fake.app()) as url:
        yield fake, url


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LaunchStore:
    """Launch records under tmp_path; the stand-in's token as HF_TOKEN, no login file."""
    monkeypatch.setenv("TRAIND_LAUNCH_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return LaunchStore()


def context(tmp_path: Path, url: str, store: LaunchStore, **table: Any) -> jobflow.Context:
    """A job launch whose traind config is a real one (a local store, no trainer)."""
    cfg = job_config(tmp_path, "hj", "hf-jobs",
                     {"image": "img:1", "endpoint": url, **FAST, **table})
    return jobflow.Context(cfg, open_job_backend(cfg), store)


async def test_wrong_or_missing_token_is_named(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong token is the Hub's 401, a missing one is said before any request; no job."""
    fake, url = hf
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(LaunchError, match=r"HTTP 401.*|refused the token") as wrong:
        async with asyncio.timeout(20):
            await jobflow.launch(context(tmp_path, url, store), tmp_path / "l.toml")
    assert "hf_wrong" not in str(wrong.value)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(LaunchError, match="no Hugging Face token"):
        async with asyncio.timeout(20):
            await jobflow.launch(context(tmp_path, url, store, secrets=[]), tmp_path / "l.toml")
    assert fake.jobs == {}
    assert store.names() == []


async def test_unknown_flavor_is_refused_by_name(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """An unknown flavor is the Hub's 400, naming the flavor; nothing runs."""
    fake, url = hf
    with pytest.raises(ProvisionError, match=r"HTTP 400: Invalid flavor 'a100x3'"):
        async with asyncio.timeout(20):
            await jobflow.launch(context(tmp_path, url, store, flavor="a100x3"),
                                 tmp_path / "l.toml")
    assert fake.live() == []
    assert fake.jobs == {}


@pytest.mark.parametrize(("status", "words"), [(402, "payment"), (403, "may not run jobs"),
                                          (429, "quota or rate limit")])
async def test_quota_and_payment_refusals(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore, status: int, words: str
) -> None:
    """402, 403 and 429 on submit say what they mean and the Hub's words; nothing runs."""
    fake, url = hf
    fake.refuse_create = (status, "Refused by the stand-in's quota")
    with pytest.raises(ProvisionError, match=rf"{words}.*HTTP {status}: Refused by"):
        async with asyncio.timeout(20):
            await jobflow.launch(context(tmp_path, url, store), tmp_path / "l.toml")
    assert fake.jobs == {}
    assert store.names() == []


async def test_missing_image_ends_in_error_and_nothing_runs(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """An image that cannot be pulled ends the job in ERROR: the launch fails with the
    platform's message, the launch is forgotten and the listing shows nothing running."""
    fake, url = hf
    fake.missing_images.add("nope:1")
    with pytest.raises(LaunchError, match="ended error before traind ran: Failed to pull"):
        async with asyncio.timeout(30):
            await jobflow.launch(context(tmp_path, url, store, image="nope:1"),
                                 tmp_path / "l.toml")
    assert len(fake.jobs) == 1
    assert fake.live() == []
    assert store.names() == []


async def test_5xx_is_retried_then_named(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """Passing 503s (submit, inspect) are retried and logged, one job is started and `down`
    cancels it; a platform that keeps answering 503 gets a clear error and runs nothing."""
    fake, url = hf
    fake.fail_next = {"create": 1, "inspect": 2}
    ctx = context(tmp_path, url, store)
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            record = await jobflow.launch(ctx, tmp_path / "l.toml")
            assert len(fake.jobs) == 1
            assert fake.live() != []
            await jobflow.down(ctx, record, pull_first=False)
    assert fake.live() == []
    assert len([e for e in logs if e["event"] == "launch_api_retry"]) == 3
    fake.fail_next = {"create": 99}
    with pytest.raises(BackendAPIError, match="HTTP 503"):
        async with asyncio.timeout(30):
            await jobflow.launch(ctx, tmp_path / "l.toml")
    assert len(fake.jobs) == 1
    assert fake.live() == []


@pytest.mark.timeout(240)
async def test_hf_jobs_life_cycle(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """``traind launch`` submits a job running ``traind run`` (config and token as secrets),
    follows its log to the end of a tiny TRL run; ``status`` says completed with the last
    commit, ``pull`` brings the newest checkpoint from the store, ``down`` leaves nothing."""
    need_module("trl")
    fake, url = hf
    launch_toml = project(tmp_path, max_steps=2, backend_toml=(
        'backend = "hf-jobs"\n\n[hf_jobs]\nimage = "traind:test"\nflavor = "cpu-basic"\n'
        'timeout = "200s"\npoll_interval = "200ms"\nlabels = { team = "ml" }\n'))
    env = {**os.environ, "HF_ENDPOINT": url}
    launcher = Launcher("-c", str(launch_toml), env=env)
    try:
        assert await asyncio.to_thread(launcher.wait, 200) == 0, launcher.tail()
        assert any(committed(line, 2) for line in launcher.out)
        assert "tiny: finished" in launcher.err
        steps = [e["step"] for e in launcher.events() if e.get("event") == "launch_step"]
        assert steps == ["submit", "wait_running"]
        (job,) = fake.jobs.values()
        assert set(job.spec["secrets"]) == {"HF_TOKEN", "TRAIND_CONFIG_TOML"}
        assert "HF_TOKEN" not in job.spec["environment"]
        assert job.spec["labels"] == {"team": "ml", "traind-launch": "tiny", "name": "tiny"}
        assert job.spec["flavor"] == "cpu-basic"
        assert job.spec["timeoutSeconds"] == 200
        facts, said = await status_pull_down(tmp_path, env)
        assert facts["instance"].startswith(f"{NAMESPACE}/")
        assert fake.live() == []
        assert store.names() == []
        logged = "\n".join(launcher.err + launcher.out + said)
        assert TOKEN not in logged
    finally:
        launcher.kill()


@pytest.mark.timeout(240)
async def test_down_cancels_a_running_job(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """``launch --detach`` leaves the job training; ``down --no-pull`` cancels it: the
    platform lists nothing running and the trainer's processes are gone."""
    need_module("trl")
    fake, url = hf
    launch_toml = project(tmp_path, max_steps=200, backend_toml=(
        'backend = "hf-jobs"\n\n[hf_jobs]\nimage = "traind:test"\npoll_interval = "200ms"\n'))
    env = {**os.environ, "HF_ENDPOINT": url}
    launcher = Launcher("-c", str(launch_toml), "--detach", env=env)

    async def probe() -> list[int]:
        return trainer_pids(tmp_path / "remote/out")

    try:
        assert await asyncio.to_thread(launcher.wait, 60) == 0, launcher.tail()
        assert fake.live() != []
        assert await poll_until(probe, within=120, every=0.2), launcher.tail()
        down = Launcher("down", "tiny", "--no-pull", env=env)
        assert await asyncio.to_thread(down.wait, 90) == 0, down.tail()
        assert fake.live() == []
        assert store.names() == []
        (job,) = fake.jobs.values()
        assert job.stage == "CANCELED"
        assert not await poll_until(probe, done=lambda pids: not pids, within=20, every=0.2)
    finally:
        launcher.kill()
        await fake.stop_all()


async def test_job_ended_at_its_timeout_is_reported_as_timeout(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """A job the platform ends at ``timeoutSeconds`` (reported ERROR) is normalised to
    timeout: following it says why it ended, and nothing is left running."""
    fake, url = hf
    ctx = context(tmp_path, url, store, timeout="3s")
    lines: list[str] = []
    async with asyncio.timeout(40):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        outcome = await jobflow.follow(ctx, record, asyncio.Event(), lines.append)
        facts = await jobflow.status(ctx, record)
    assert outcome == "timeout"
    assert facts["state"] == "timeout"
    assert "timeout" in facts["message"].lower()
    assert any(log_event(line) for line in lines), lines
    assert fake.live() == []


async def test_recoveries_run_out_with_a_clear_error_and_nothing_running(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """Each job ended at its timeout is cancelled and replaced by the next, logged and saved;
    after ``max_recoveries`` the launch fails naming the limit, with nothing left running."""
    fake, url = hf
    ctx = context(tmp_path, url, store, timeout="3s")
    ctx = jobflow.Context(ctx.config.model_copy(update={"run": ctx.config.run.model_copy(
        update={"max_recoveries": 2})}), ctx.backend, store)
    with capture_logs() as logs:
        async with asyncio.timeout(50):
            record = await jobflow.launch(ctx, tmp_path / "l.toml")
            with pytest.raises(LaunchError, match="max_recoveries = 2"):
                await jobflow.follow_recovering(ctx, record, asyncio.Event(), lambda _: None)
    recovered = [e for e in logs if e["event"] == "launch_recovered"]
    assert [e["state"] for e in recovered] == ["timeout", "timeout"]
    assert all(e["seconds"] >= 0 and "timeout" in e["message"].lower() for e in recovered)
    assert len(fake.jobs) == 3
    assert fake.live() == []
    assert len(store.load("hj").recoveries) == 2


async def test_down_during_recovery_starts_no_new_job(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """A launch taken down (its record removed by ``down`` elsewhere) while its job ends is
    not recovered: the follower stops with "taken down" and submits nothing more."""
    fake, url = hf
    ctx = context(tmp_path, url, store, timeout="3s")
    async with asyncio.timeout(40):
        record = await jobflow.launch(ctx, tmp_path / "l.toml")
        following = asyncio.create_task(
            jobflow.follow_recovering(ctx, record, asyncio.Event(), lambda _: None))
        await jobflow.down(ctx, record, pull_first=False)
        assert await following == "taken down"
    assert len(fake.jobs) == 1
    assert fake.live() == []


@pytest.mark.timeout(420)
async def test_a_run_outlives_two_ended_jobs(
    tmp_path: Path, hf: tuple[FakeHFJobs, str], store: LaunchStore
) -> None:
    """A job preempted and one timed out mid-training (each with a fresh disk) are replaced:
    the next restores the newest committed checkpoint, the run ends with the trainer's exit 0,
    no step trained more than once again since that checkpoint, nothing left running."""
    need_module("trl")
    fake, url = hf
    fake.scheduling = 3.0  # the test wipes the ended job's disk before the next one starts
    launch_toml = project(tmp_path, max_steps=10, backend_toml=(
        'backend = "hf-jobs"\n\n[hf_jobs]\nimage = "traind:test"\npoll_interval = "200ms"\n'))
    resuming(tmp_path)
    launcher = Launcher("-c", str(launch_toml), env={**os.environ, "HF_ENDPOINT": url})

    def ending(stage: str, message: str) -> Callable[[], Awaitable[None]]:
        async def end() -> None:
            (job_id,) = fake.live()
            await fake.end(job_id, stage, message)
        return end

    try:
        recovered = await outlive(launcher, tmp_path / "remote", [
            ("preemption", ending("ERROR", "Job was preempted")),
            ("timeout", ending("ERROR", "Job timeout: it ran 60 seconds"))])
        for recovery in recovered:
            print(recovery.row("hf-jobs"))
        assert len(fake.jobs) == 3
        assert fake.live() == []
    finally:
        launcher.kill()
        await fake.stop_all()

"""A daemon stopped on the Hub between sending a checkpoint's files and committing them (its
commit throttled, say): what it pre-uploaded was never committed, so the next daemon's
commit finds the files missing, sends them again at once (the Hub has the bytes: only
hashes move) and commits the checkpoint in one commit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.conformance.conftest import hf_config
from tests.support.checkpoints import run_in, write_checkpoint
from tests.support.fake_hub import FakeHub, running_hub
from tests.support.waits import until
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.state.journal import Journal

from traind.checkpoints.restore import recovery
from traind.protocol import open_storage
from traind.storage.base import OVERWRITE

REPO = "traind/restart"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """A stand-in allowing one commit per ten minutes, until the test lifts the limit."""
    with running_hub(FakeHub(commit_budget=1, window=600.0)) as server:
        yield server


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_restarted_daemon_sends_staged_files_again(hub: FakeHub, tmp_path: Path) -> None:
    """The first daemon's commit is throttled and it stops; the next one's first commit
    says the files are missing (logged once, no failure), sends them again at once without
    a byte of LFS going up twice, and commits the checkpoint in one commit."""
    config = hf_config(hub, REPO)
    write_checkpoint(tmp_path / "out", 3, size=4096, nfiles=2)
    state = tmp_path / "state"
    first = open_storage(config, "r")
    await first.objects.put("setup", b"uses the one commit of the window", OVERWRITE)
    journal = Journal.in_state_dir(state, run_in(tmp_path))
    streamer = Streamer("r", state, first, journal)
    await streamer.stage("checkpoint-3", 3, tmp_path / "out" / "checkpoint-3")
    await streamer.complete("checkpoint-3", 3)
    with capture_logs() as logs:
        task = asyncio.create_task(streamer.run())
        try:  # the files pre-uploaded, the commit waits out a 429 until the daemon stops
            await until(lambda: any(e["event"] == "hf_rate_limited" for e in logs), 60)
        finally:
            await _stop(task)
    assert await first.manifests() == []
    uploads = hub.lfs_uploads
    hub.commit_budget = 10_000
    second = open_storage(config, "r")  # the next daemon: a new store handle, same journal
    journal = Journal.in_state_dir(state, run_in(tmp_path))
    streamer = Streamer("r", state, second, journal)
    await recovery.recover(streamer, journal, await second.manifests())
    with capture_logs() as logs:
        task = asyncio.create_task(streamer.run())
        try:
            async with asyncio.timeout(60):
                await streamer.wait_idle()
        finally:
            await _stop(task)
    assert [m.tag for m in await second.manifests()] == ["checkpoint-3"]
    missing = [e for e in logs if e["event"] == "checkpoint_files_missing"]
    assert len(missing) == 1
    assert not [e for e in logs if e["event"] == "checkpoint_upload_failed"]
    assert hub.lfs_uploads == uploads  # the bytes were on the Hub: none sent twice
    commits = [c.message for c in hub.commits("model", REPO) if "checkpoint-3" in c.message]
    assert len(commits) == 1

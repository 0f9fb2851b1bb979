"""A trainer saving faster than the Hub's commit budget: the streamer commits the newest and
every pinned checkpoint (each one commit of its files and manifest; the 429s waited out)
and logs the ones it coalesced away."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.conformance.conftest import hf_config
from tests.support.checkpoints import run_in, write_checkpoint
from tests.support.fake_hub import FakeHub, running_hub
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.state.journal import Journal

from traind.protocol import open_storage


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """A stand-in allowing two commits per two seconds."""
    with running_hub(FakeHub(commit_budget=2, window=2.0)) as server:
        yield server


async def test_a_fast_trainer_loses_no_pinned_or_newest_checkpoint(
        hub: FakeHub, tmp_path: Path) -> None:
    """Six checkpoints wait at once; with keep_every_steps = 20 the streamer commits 20, 40
    and the newest, 60, coalesces 10, 30 and 50 (logged), and every 429 is waited out."""
    store = open_storage(hf_config(hub, "traind/fast"), "r")
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    streamer = Streamer("r", tmp_path / "state", store, journal, coalesce_every=20)
    for step in range(10, 70, 10):
        write_checkpoint(tmp_path / "out", step, size=2048, nfiles=1)
        tag = f"checkpoint-{step}"
        await streamer.stage(tag, step, tmp_path / "out" / tag)
        await streamer.complete(tag, step)
    with capture_logs() as logs:
        loop = asyncio.create_task(streamer.run())
        try:
            async with asyncio.timeout(90):
                await streamer.wait_idle()
        finally:
            loop.cancel()
            with pytest.raises(asyncio.CancelledError):
                await loop
    committed = sorted(m.step for m in await store.manifests())
    coalesced = sorted(e["step"] for e in logs if e["event"] == "checkpoint_coalesced")
    assert committed == [20, 40, 60]
    assert coalesced == [10, 30, 50]
    messages = [c.message for c in hub.repos[("model", "traind/fast")].commits.values()]
    made = [re.fullmatch(r"traind r: commit checkpoint-(\d+) of writer \w+@\S+ \(host \S+\)", m)
            for m in messages[1:]]  # after the repo's first commit
    assert sorted(int(m.group(1)) for m in made if m) == [20, 40, 60]
    assert len(messages) == 4  # one commit per checkpoint, naming it and its writer
    assert "429" in hub.refused
    assert any(e["event"] == "hf_rate_limited" for e in logs)
    assert all(e["newer"] == "checkpoint-60" for e in logs if e["event"] == "checkpoint_coalesced")

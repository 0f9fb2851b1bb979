"""Start-up recovery before the store has answered: ready snapshots wait for ``reconcile``."""

from __future__ import annotations

from pathlib import Path

from tests.support.checkpoints import run_in, write_checkpoint

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.restore import recovery
from traind.checkpoints.state.journal import Journal
from traind.protocol.testing import MemoryBackend


async def test_ready_snapshots_are_settled_against_the_store_once_it_answers(
    tmp_path: Path,
) -> None:
    """Without manifests nothing ready is queued or marked; once they come, the one the
    store already holds is committed without a second upload and the other is queued."""
    store = MemoryBackend("r")
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    try:
        streamer = Streamer("r", tmp_path / "state", store, journal)
        for step in (1, 2):
            write_checkpoint(tmp_path / "out", step)
            tag = f"checkpoint-{step}"
            await streamer.stage(tag, step, tmp_path / "out" / tag)
            await journal.set_state(tag, "ready")
        await streamer.commit("checkpoint-1")
        await journal.set_state("checkpoint-1", "ready")  # killed before the journal said so
        uploaded = dict(store.memory.objects)

        tracked, ready = await recovery.recover(streamer, journal, None)
        assert (tracked, ready, streamer.queued) == ([], ["checkpoint-1", "checkpoint-2"], 0)
        assert {e.state for e in await journal.entries()} == {"ready"}

        await recovery.reconcile(streamer, journal, await store.manifests(), ready)
        assert [e.tag for e in await journal.entries("committed")] == ["checkpoint-1"]
        assert streamer.unstored == ["checkpoint-2"]
        assert store.memory.objects == uploaded
    finally:
        journal.close()

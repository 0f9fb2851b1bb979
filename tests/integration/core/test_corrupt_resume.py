"""A resume point missing or torn on disk is restored from the store; when the store's copy
is corrupt too, the next older checkpoint is the resume point, and the corrupt one is
remembered in the journal (old journals gain the table on open)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import commit_through_streamer, rewrite, run_in

from traind.checkpoints.restore.recovery import restore_if_fresh, resume_point
from traind.checkpoints.state.journal import Journal
from traind.config import CheckpointsConfig
from traind.errors import IntegrityError
from traind.protocol.testing import MemoryBackend


async def test_a_torn_resume_point_corrupt_in_the_store_falls_back(tmp_path: Path) -> None:
    """checkpoint-4 torn on disk and corrupt in the store: checkpoint-3 is resumed from, 4
    logged as an error once and then skipped without being downloaded again."""
    store = MemoryBackend("r")
    (await commit_through_streamer(tmp_path, store, 3)).close()
    journal = await commit_through_streamer(tmp_path, store, 4)
    out, config = tmp_path / "out", CheckpointsConfig()
    try:
        rewrite(out / "checkpoint-4/shard-0.bin", b"torn")  # killed while saving it again
        stored = bytearray(store.memory.objects["checkpoint-4/shard-1.bin"])
        stored[7] ^= 1
        store.memory.objects["checkpoint-4/shard-1.bin"] = bytes(stored)
        with capture_logs() as first:
            assert await resume_point(store, journal, out, config) == out / "checkpoint-3"
        with capture_logs() as second:
            assert await resume_point(store, journal, out, config) == out / "checkpoint-3"
    finally:
        journal.close()
    corrupt = [e for e in first if e["event"] == "checkpoint_corrupt"]
    assert [(e["tag"], e["log_level"]) for e in corrupt] == [("checkpoint-4", "error")]
    assert "shard-1.bin" in corrupt[0]["error"]
    assert not (out / "checkpoint-4").exists()
    events = [e["event"] for e in second]
    assert "checkpoint_corrupt" not in events
    assert "restore_skipped_corrupt" in events
    reopened = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    try:
        assert [tag for tag, _ in await reopened.corrupt()] == ["checkpoint-4"]
    finally:
        reopened.close()


async def test_a_fresh_host_with_no_checkpoint_that_verifies_starts_without_one(
    tmp_path: Path,
) -> None:
    """Every stored checkpoint corrupt: the fresh host restores nothing, says so at error
    level, and leaves output_dir empty for the trainer to start from scratch."""
    store = MemoryBackend("r")
    (await commit_through_streamer(tmp_path, store, 1)).close()
    store.memory.objects["checkpoint-1/shard-0.bin"] = b"rotten"
    out = tmp_path / "fresh"
    out.mkdir()
    journal = Journal.in_state_dir(tmp_path / "fresh-state", run_in(tmp_path))
    try:
        with capture_logs() as logs:
            await restore_if_fresh(store, journal, await store.manifests(), out,
                                   CheckpointsConfig())
    finally:
        journal.close()
    failed = [e for e in logs if e["event"] == "restore_failed"]
    assert [e["log_level"] for e in failed] == ["error"]
    assert list(out.iterdir()) == []


async def test_the_memory_store_reports_a_missing_object_like_the_real_ones(
    tmp_path: Path,
) -> None:
    """The test double keeps the download contract: a missing object is an IntegrityError."""
    store = MemoryBackend("r")
    (await commit_through_streamer(tmp_path, store, 1)).close()
    del store.memory.objects["checkpoint-1/shard-0.bin"]
    (manifest,) = await store.manifests()
    with pytest.raises(IntegrityError, match=r"checkpoint-1/shard-0\.bin: missing"):
        await store.download(manifest, tmp_path / "dest", lambda n: None)

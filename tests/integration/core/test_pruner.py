"""Local retention deletes only directories the journal says were stored from output_dir."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.checkpoints import (
    commit_through_streamer,
    one_file,
    rewrite,
    run_in,
    write_checkpoint,
)

from traind.checkpoints.restore.download import identity
from traind.checkpoints.retention import pruner
from traind.checkpoints.state.journal import Journal
from traind.config import RetentionConfig
from traind.layout.manifest import Manifest, Writer
from traind.protocol.testing import MemoryBackend

W = Writer("a" * 32, "h")


async def test_a_directory_sharing_a_committed_tag_is_not_deleted(tmp_path: Path) -> None:
    """checkpoint-5 is committed, but from another directory: the one in output_dir of the
    same name (another run's, say) stays; checkpoint-6, stored from here, goes."""
    out = tmp_path / "out"
    store = MemoryBackend("r")
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    try:
        for step, source in [(5, tmp_path / "elsewhere"), (6, out)]:
            tag = f"checkpoint-{step}"
            await journal.record_committed(tag, step, source / tag, store.describe)
            await store.commit(Manifest("r", tag, step, await one_file(store, tag), writer=W))
        for step in (5, 6, 7):
            write_checkpoint(out, step)
        plan = await pruner.prune(
            store, journal, RetentionConfig(keep_local=1), out, "checkpoint-*"
        )
    finally:
        journal.close()
    assert {v.tag: (v.keep, v.reason) for v in plan.local} == {
        "checkpoint-7": (True, "among the last 1 on disk"),
        "checkpoint-6": (False, "committed, older than the last 1"),
        "checkpoint-5": (True, "not committed yet"),
    }
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-5", "checkpoint-7"]


async def test_a_delete_cut_short_is_finished_by_the_next_prune(tmp_path: Path) -> None:
    """A daemon killed between deleting a manifest and its files left them in the store
    (journal state ``pruning``): the next prune removes them and records ``pruned``."""
    store = MemoryBackend("r")
    store.memory.objects["checkpoint-2/model.bin"] = b"orphaned"
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    try:
        await journal.record_committed("checkpoint-2", 2, tmp_path / "out/checkpoint-2", "m")
        await journal.set_state("checkpoint-2", "pruning")
        await pruner.prune(store, journal, RetentionConfig(), tmp_path / "out", "checkpoint-*")
        entry = await journal.get("checkpoint-2")
    finally:
        journal.close()
    assert store.memory.objects == {}
    assert entry is not None
    assert entry.state == "pruned"


async def test_a_committed_directory_saved_again_is_not_deleted(tmp_path: Path) -> None:
    """The trainer saved checkpoint-1 again after it was committed: the directory on disk is
    no longer what the store holds, so local retention keeps it."""
    store = MemoryBackend("r")
    journal = await commit_through_streamer(tmp_path, store, 1)
    out = tmp_path / "out"
    try:
        await asyncio.sleep(0.02)
        rewrite(out / "checkpoint-1" / "shard-1.bin", b"saved again")
        write_checkpoint(out, 2)
        plan = await pruner.prune(store, journal, RetentionConfig(keep_local=1), out,
                                  "checkpoint-*")
    finally:
        journal.close()
    assert {v.tag: v.keep for v in plan.local} == {"checkpoint-2": True, "checkpoint-1": True}
    assert (out / "checkpoint-1" / "shard-1.bin").read_bytes() == b"saved again"


async def test_a_corrupt_newest_does_not_count_towards_keep_last(tmp_path: Path) -> None:
    """checkpoint-4 is recorded corrupt: with keep_last=1, checkpoint-3 (the newest that
    verifies) stays in the store, and so does 4, unused but kept for repair."""
    store = MemoryBackend("r")
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    try:
        for step in (2, 3, 4):
            tag = f"checkpoint-{step}"
            await store.commit(Manifest("r", tag, step, await one_file(store, tag), writer=W))
        bad = store.manifest_by_tag["checkpoint-4"]
        await journal.record_corrupt("checkpoint-4", identity(bad), "x: sha256 differs")
        plan = await pruner.prune(
            store, journal, RetentionConfig(keep_last=1), tmp_path / "out", "checkpoint-*"
        )
    finally:
        journal.close()
    assert {v.tag: (v.keep, v.reason) for v in plan.remote} == {
        "checkpoint-4": (True, "corrupt in the store: not counted, kept for repair"),
        "checkpoint-3": (True, "newest"),
        "checkpoint-2": (False, "older than the last 1"),
    }
    assert sorted(store.manifest_by_tag) == ["checkpoint-3", "checkpoint-4"]

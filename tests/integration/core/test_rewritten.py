"""A checkpoint the trainer saves again after it was complete (a trainer resumed from an
older one re-saves the steps after it; torch.save and safetensors write in place) shares its
files with the snapshot's hard links. It must never be committed with files of two saves or
with hashes of bytes other than those it was snapshot with: the daemon notices, snapshots
it again, and commits what the trainer wrote last."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import commit_through_streamer, rewrite, run_in, write_checkpoint

from traind.app.daemon import Daemon
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake import snapshot
from traind.checkpoints.restore.recovery import resume_point
from traind.checkpoints.state.journal import Journal, State
from traind.config import Settings, validate
from traind.layout.manifest import Manifest
from traind.protocol.testing import MemoryBackend
from traind.storage import LocalFile, UploadSession


class GatedStore(MemoryBackend):
    """A memory store whose uploads wait for ``gate``; ``started`` is set by the first,
    ``committed`` by every commit."""

    def __init__(self) -> None:
        super().__init__("r")
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.committed = asyncio.Event()

    async def commit(self, manifest: Manifest) -> None:
        await super().commit(manifest)
        self.committed.set()

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        self.started.set()
        await self.gate.wait()
        await super().upload(tag, root, files, session)


def settings(tmp_path: Path) -> Settings:
    return validate({
        "run": {"name": "r", "output_dir": str(tmp_path / "out"),
                "state_dir": str(tmp_path / "state")},
        "storage": {"type": "local", "path": str(tmp_path / "unused")},
        "checkpoints": {"settle": "0.3s", "poll_interval": "0.1s"},
        "retention": {"keep_local": None},
        "status": {"enabled": False},
    })


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[GatedStore]:
    """A running daemon's store."""
    store = GatedStore()
    d = await Daemon.open(settings(tmp_path), storage=store)
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        yield store
    finally:
        stop.set()
        store.gate.set()
        async with asyncio.timeout(20):
            await task


async def test_rewritten_checkpoint_is_snapshot_again_and_committed_as_last_saved(
    tmp_path: Path, store: GatedStore
) -> None:
    """Rewritten while its upload waits: not committed as it was, but as saved last."""
    first = write_checkpoint(tmp_path / "out", 1)
    async with asyncio.timeout(20):
        await store.started.wait()  # complete, snapshot, and its upload under way
    await asyncio.sleep(0.05)  # a later mtime, as a save seconds later would have
    shard = tmp_path / "out" / "checkpoint-1" / "shard-0.bin"
    second = dict(first, **{"shard-0.bin": rewrite(shard, os.urandom(70_000))})
    store.gate.set()
    async with asyncio.timeout(20):
        await store.committed.wait()
    committed = store.manifest_by_tag["checkpoint-1"]
    assert {f.path: f.sha256 for f in committed.files} == second
    assert {f.path: f.size for f in committed.files}["shard-0.bin"] == 70_000
    assert store.memory.objects["checkpoint-1/shard-0.bin"] == shard.read_bytes()


async def test_push_of_a_checkpoint_rewritten_mid_upload_fails(tmp_path: Path) -> None:
    """Without a watcher to look again (``traind push``), the commit fails, naming the file."""
    store = GatedStore()
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    streamer = Streamer("r", tmp_path / "state", store, journal)
    write_checkpoint(tmp_path / "out", 2)
    source = tmp_path / "out" / "checkpoint-2"
    try:
        await streamer.stage("checkpoint-2", 2, source)
        await journal.set_state("checkpoint-2", "ready")
        committing = asyncio.create_task(streamer.commit("checkpoint-2"))
        async with asyncio.timeout(10):
            await store.started.wait()
        await asyncio.sleep(0.05)
        rewrite(source / "shard-1.bin", b"x" * 10)
        store.gate.set()
        with pytest.raises(snapshot.RewrittenError, match=r"shard-1\.bin"):
            async with asyncio.timeout(10):
                await committing
    finally:
        journal.close()
    assert store.manifest_by_tag == {}


async def test_trainer_resumes_from_newest_complete_checkpoint_not_yet_stored(
    tmp_path: Path,
) -> None:
    """A checkpoint complete on disk and waiting for its upload is the resume point, so the
    trainer does not save it again over its snapshot; one missing locally is skipped."""
    s = settings(tmp_path)
    out = s.run.output_dir
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    store = MemoryBackend("r")
    try:
        states: list[tuple[int, State]] = [(1, "committed"), (2, "ready"), (3, "ready")]
        for step, state in states:
            write_checkpoint(out, step)
            await journal.staged(f"checkpoint-{step}", step, out / f"checkpoint-{step}", [])
            await journal.set_state(f"checkpoint-{step}", state)
        (out / "checkpoint-3" / "trainer_state.json").unlink()  # never finished on disk
        assert await resume_point(store, journal, out, s.checkpoints) == out / "checkpoint-2"
    finally:
        journal.close()


async def test_a_resume_point_saved_again_since_committed_is_restored(tmp_path: Path) -> None:
    """A trainer killed while saving a committed checkpoint again leaves it torn: it is not
    resumed from, but replaced by the store's copy (once: the restored copy is then the
    journal's)."""
    store = MemoryBackend("r")
    journal = await commit_through_streamer(tmp_path, store, 6)
    out = tmp_path / "out"
    shard = out / "checkpoint-6" / "shard-0.bin"
    good = store.memory.objects["checkpoint-6/shard-0.bin"]
    try:
        await asyncio.sleep(0.02)
        rewrite(shard, good[:1000])  # torn: cut short mid-save
        with capture_logs() as logs:
            for _ in range(2):
                path = await resume_point(store, journal, out, settings(tmp_path).checkpoints)
                assert path == out / "checkpoint-6"
    finally:
        journal.close()
    assert shard.read_bytes() == good
    restores = [e for e in logs if e["event"] == "restore_starting"]
    assert [e["reason"] for e in restores] == ["saved again: shard-0.bin"]

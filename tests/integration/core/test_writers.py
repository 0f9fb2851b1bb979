"""Two writers, one namespace, on the local store: a tag is one writer's, never mixed."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import one_file, run_in
from tests.support.writers import check_one_writer_each, close, race, side

from traind.checkpoints.restore.download import find, restore
from traind.checkpoints.retention import pruner
from traind.checkpoints.state.journal import Journal
from traind.config import LocalStorage, RetentionConfig
from traind.errors import IntegrityError, NotFoundError
from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore, open_storage
from traind.protocol.ownership import ClaimHeldError, ConflictError
from traind.protocol.testing import MemoryBackend

A = Writer("a" * 32, "host-a")
B = Writer("b" * 32, "host-b")


def local(tmp_path: Path) -> CheckpointStore:
    return open_storage(LocalStorage(path=tmp_path / "store"), "run1")


async def test_two_streamers_same_tags_one_writer_each(tmp_path: Path) -> None:
    """Two writers racing for checkpoint-1..3 of one run: each tag is one writer's, whole;
    the other is told (checkpoint_conflict), journals 'conflict' and keeps its copies."""
    with capture_logs() as logs:
        sides = await race(tmp_path, (local(tmp_path), local(tmp_path)))
    try:
        await check_one_writer_each(sides, local(tmp_path), tmp_path)
    finally:
        close(sides)
    conflicts = [e for e in logs if e["event"] == "checkpoint_conflict"]
    assert sorted(e["tag"] for e in conflicts) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert all(e["log_level"] == "error" and e["theirs"] != e["ours"] for e in conflicts)


async def test_second_writer_sends_no_byte_over_the_first(tmp_path: Path) -> None:
    """A writer finding the tag claimed by another (its upload live) waits before its
    first data byte, journal still 'ready': the first writer's half-uploaded objects stay
    as they were (same inode, same bytes)."""
    store = local(tmp_path)
    await store.claim("checkpoint-1", A)
    tag_dir = tmp_path / "store" / "run1" / "checkpoint-1"
    (tag_dir / "shard-0.bin").write_bytes(b"first writer's bytes")
    inode = (tag_dir / "shard-0.bin").stat().st_ino
    sides = await race(tmp_path, (local(tmp_path), local(tmp_path)), steps=1, wait_held=1.0)
    try:
        assert all(isinstance(s.outcome["checkpoint-1"], ClaimHeldError) for s in sides)
        assert {str(A)} == {s.outcome["checkpoint-1"].theirs  # type: ignore[union-attr]
                            for s in sides}
        for s in sides:
            entry = await s.journal.get("checkpoint-1")
            assert entry is not None
            assert entry.state == "ready"
    finally:
        close(sides)
    assert (tag_dir / "shard-0.bin").read_bytes() == b"first writer's bytes"
    assert (tag_dir / "shard-0.bin").stat().st_ino == inode
    assert sorted(p.name for p in tag_dir.iterdir()) == sorted([CLAIM_NAME, "shard-0.bin"])


@pytest.mark.parametrize("kind", ["local", "memory"])
async def test_racing_claims_exactly_one_wins(tmp_path: Path, kind: str) -> None:
    """Sixteen writers claiming one tag at once: exactly one gets it, the rest are told
    it is held (ClaimHeldError, a ConflictError naming the winner)."""
    shared = MemoryBackend("run1")
    writers = [Writer(f"{n:032x}", f"host-{n}") for n in range(16)]
    stores = [local(tmp_path) if kind == "local" else shared for _ in writers]
    async with asyncio.timeout(30):
        results = await asyncio.gather(
            *(s.claim("checkpoint-9", w) for s, w in zip(stores, writers, strict=True)),
            return_exceptions=True)
    winners = [w for w, r in zip(writers, results, strict=True) if r is None]
    assert len(winners) == 1
    assert all(isinstance(r, ConflictError) and r.theirs == str(winners[0])
               for r in results if r is not None)
    await stores[0].claim("checkpoint-9", winners[0])  # the holder again: a restart, a retry


async def test_manifest_is_created_once(tmp_path: Path) -> None:
    """A commit never replaces another writer's manifest; its own (a retry) it may."""
    store = local(tmp_path)
    ours = Manifest("run1", "checkpoint-1", 1, (FileEntry("x", 1, "0" * 64),), writer=A)
    (tmp_path / "store" / "run1" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "store" / "run1" / "checkpoint-1" / "x").write_bytes(b"x")
    await store.commit(ours)
    with pytest.raises(ConflictError):
        await store.commit(Manifest("run1", "checkpoint-1", 1, (), writer=B))
    await store.commit(ours)
    assert [m.writer for m in await store.manifests()] == [A]


async def test_a_manifest_naming_no_writer_is_unreadable(tmp_path: Path) -> None:
    """A stored manifest naming no writer is malformed: named in the listing, never found
    to restore, pruned or claimed over; every other checkpoint listed, restored and pruned.
    A commit never writes one."""
    store = local(tmp_path)
    for step in (1, 2, 3, 4):
        tag = f"checkpoint-{step}"
        await store.claim(tag, A)
        await store.commit(Manifest("run1", tag, step, await one_file(store, tag), writer=A))
    nameless = tmp_path / "store" / "run1" / "checkpoint-4" / MANIFEST_NAME
    with pytest.raises(ValueError, match="naming no writer is not committed"):
        await store.commit(replace(Manifest.from_json(nameless.read_bytes()), writer=None))
    nameless.write_text(json.dumps(json.loads(nameless.read_bytes()) | {"writer": None}))
    with capture_logs() as logs:
        listing = await store.listing()
    assert sorted(m.tag for m in listing.manifests) == [f"checkpoint-{n}" for n in (1, 2, 3)]
    assert [(u.where, u.error) for u in listing.unreadable] == [
        (str(nameless), "malformed manifest: writer None is not an object")]
    assert [e["where"] for e in logs if e["event"] == "manifest_unreadable"] == [str(nameless)]
    with pytest.raises(NotFoundError):
        await find(store, "checkpoint-4")
    restored = await restore(store, await find(store, "latest"), tmp_path / "restored")
    assert restored.name == "checkpoint-3"
    with pytest.raises(IntegrityError, match="malformed manifest"):
        await store.claim("checkpoint-4", B)
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    try:
        plan = await pruner.prune(store, journal, RetentionConfig(keep_last=1),
                                  tmp_path / "out", "checkpoint-*")
    finally:
        journal.close()
    assert {v.tag: v.keep for v in plan.remote} == {
        "checkpoint-1": False, "checkpoint-2": False, "checkpoint-3": True}
    assert [m.tag for m in await store.manifests()] == ["checkpoint-3"]
    assert nameless.exists()


async def test_delete_removes_the_claim_last(tmp_path: Path) -> None:
    """Pruning removes manifest, objects and claim; the tag is free for a writer again."""
    store = local(tmp_path)
    await store.claim("checkpoint-1", A)
    await store.commit(Manifest("run1", "checkpoint-1", 1, (), writer=A))
    await store.delete("checkpoint-1")
    assert not (tmp_path / "store" / "run1" / "checkpoint-1").exists()
    await store.claim("checkpoint-1", B)


async def test_the_same_bytes_another_writer_stored_are_no_conflict(tmp_path: Path) -> None:
    """A checkpoint byte-identical to the one another writer committed (an output_dir shared
    with it) is journalled committed without a byte sent; one differing in a byte conflicts."""
    first = await side(tmp_path, "a", local(tmp_path), steps=2)
    second = await side(tmp_path, "b", local(tmp_path), steps=0)
    try:
        for tag in ("checkpoint-1", "checkpoint-2"):
            await first.streamer.commit(tag)
        for step in (1, 2):
            tag = f"checkpoint-{step}"
            shutil.copytree(first.root / "out" / tag, second.root / "out" / tag)
            await second.streamer.stage(tag, step, second.root / "out" / tag)
            await second.journal.set_state(tag, "ready")
        shard = second.streamer.staging / "checkpoint-2" / "shard-0.bin"
        shard.write_bytes(b"x" + shard.read_bytes()[1:])  # same size, one byte different
        with capture_logs() as logs:
            got = await second.streamer.commit("checkpoint-1")
            with pytest.raises(ConflictError):
                await second.streamer.commit("checkpoint-2")
        assert got.writer == first.writer
        entry = await second.journal.get("checkpoint-1")
        assert entry is not None
        assert entry.state == "committed"
        assert not (second.streamer.staging / "checkpoint-1").exists()
        assert [e["event"] for e in logs] == ["checkpoint_already_stored", "checkpoint_conflict"]
    finally:
        close([first, second])

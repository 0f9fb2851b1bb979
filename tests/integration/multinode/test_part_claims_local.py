"""The local store's parts: one claim per (tag, node rank), a single writer's tag and a
job's tag never mixed, a path two hosts store kept only when the bytes agree, and no part
claimed again once its checkpoint was pruned."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.conformance.test_multinode_parts import staged_host
from tests.support.sessions import RecordingSession

from traind.checkpoints.commit.lifecycle import PartsGoneError, PartsPendingError
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.config import LocalStorage
from traind.layout.manifest import Manifest, Writer
from traind.layout.parts import Part, PartsDisagreeError
from traind.protocol import CheckpointStore, open_storage
from traind.protocol.ownership import ConflictError
from traind.storage import LocalFile, open_objects
from traind.util.nodes import NodeRank

W0, W1, OTHER = Writer("0" * 32, "node0"), Writer("1" * 32, "node1"), Writer("f" * 32, "x")
TAG = "checkpoint-4"


def store(tmp_path: Path) -> CheckpointStore:
    return open_storage(LocalStorage(path=tmp_path / "store"), "run")


async def test_each_rank_claims_its_own_part(tmp_path: Path) -> None:
    """Two hosts claim ranks 0 and 1 of one tag; a second writer for a rank is refused, and
    a retried claim by its holder is not."""
    backend = store(tmp_path)
    await backend.claim_part(TAG, 0, W0)
    await backend.claim_part(TAG, 1, W1)
    await backend.claim_part(TAG, 1, W1)
    with pytest.raises(ConflictError, match="belongs to writer 111111111111@node1"):
        await backend.claim_part(TAG, 1, OTHER)


async def test_single_writer_and_parts_never_share_a_tag(tmp_path: Path) -> None:
    """A traind of one node cannot take a job's tag, nor a job's host one a single writer
    took: anything else writing there is still a conflict."""
    backend = store(tmp_path)
    await backend.claim_part(TAG, 0, W0)
    with pytest.raises(ConflictError):
        await backend.claim(TAG, OTHER)
    assert not (tmp_path / "store" / "run" / TAG / "traind-writer.json").exists()
    await backend.claim("checkpoint-5", OTHER)
    with pytest.raises(ConflictError):
        await backend.claim_part("checkpoint-5", 1, W1)
    assert not (tmp_path / "store" / "run" / "checkpoint-5" / "traind-writer-1.json").exists()


async def test_same_path_is_stored_once_and_never_overwritten(tmp_path: Path) -> None:
    """The same relative path from two hosts: equal bytes are kept as they are, other
    bytes are refused and the stored file is left untouched."""
    backend = store(tmp_path)
    hosts = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    for root, text in zip(hosts, ["same", "same", "diff"], strict=True):
        root.mkdir()
        (root / "config.json").write_text(text)
    for root in hosts[:2]:
        session = RecordingSession()
        await backend.upload_part(TAG, root, [LocalFile("config.json", 4)], session)
        assert set(session.done) == {"config.json"}
    with pytest.raises(PartsDisagreeError, match=r"config\.json in the store"):
        await backend.upload_part(TAG, hosts[2], [LocalFile("config.json", 4)], RecordingSession())
    stored = tmp_path / "store" / "run" / TAG
    assert (stored / "config.json").read_text() == "same"
    assert sorted(p.name for p in stored.iterdir()) == ["config.json"]


async def test_part_pruned_while_waiting_leaves_no_orphan(tmp_path: Path) -> None:
    """A host whose part waited while the checkpoint was committed and then pruned (by
    node 0) does not claim the tag again: no orphan part is left in the store."""
    backend = store(tmp_path)
    streamers = []
    for rank in (0, 1):
        streamer, journal = await staged_host(tmp_path, rank, backend)
        streamers.append((streamer, journal))
    with pytest.raises(PartsPendingError):
        await streamers[1][0].commit(TAG)
    await streamers[0][0].commit(TAG)  # the last part in: the union is committed
    await backend.delete(TAG)  # node 0's retention
    with pytest.raises(PartsGoneError):
        await streamers[1][0].commit(TAG)
    assert not (tmp_path / "store" / "run" / TAG).exists()
    for _, journal in streamers:
        journal.close()


class Counting(CheckpointStore):
    """The local backend, counting the part calls each host makes."""

    def __init__(self, config: LocalStorage) -> None:
        super().__init__(open_objects(config, "run"), "run")
        self.calls: list[str] = []

    async def part_ranks(self, tag: str) -> set[int]:
        self.calls.append("part_ranks")
        return await super().part_ranks(tag)

    async def parts(self, tag: str) -> list[Part]:
        self.calls.append("parts")
        return await super().parts(tag)

    async def commit_part(self, part: Part) -> None:
        self.calls.append("commit_part")
        await super().commit_part(part)

    async def committed(self, tag: str) -> Manifest | None:
        self.calls.append("committed")
        return await super().committed(tag)


async def test_only_the_last_part_reads_the_parts(tmp_path: Path) -> None:
    """Each host lists the part names once; only the host completing the set reads the
    part manifests, and a waiting host learns of the commit from one small read."""
    hosts = []
    for rank in (0, 1):
        backend = Counting(LocalStorage(path=tmp_path / "store"))
        streamer, journal = await staged_host(tmp_path, rank, backend)
        hosts.append((streamer, journal, backend))
    (waiting, journal1, store1), (last, journal0, store0) = hosts[1], hosts[0]
    with pytest.raises(PartsPendingError):
        await waiting.commit(TAG)
    union_manifest = await last.commit(TAG)
    assert store0.calls == ["commit_part", "part_ranks", "parts"]
    assert await waiting.commit(TAG) == union_manifest
    assert store1.calls == ["commit_part", "part_ranks", "committed"]
    journal0.close()
    journal1.close()


async def test_shutdown_keeps_a_part_claim_and_says_nothing_released(tmp_path: Path) -> None:
    """A part claim is no lease: a shutdown leaving the part unstored keeps it for that
    node's next daemon and logs no claim as released."""
    backend = store(tmp_path)
    src = tmp_path / "out1" / TAG
    src.mkdir(parents=True)
    (src / "__1_0.distcp").write_bytes(b"xx")
    journal = Journal(tmp_path / "state1" / "journal.sqlite3",
                      RunIdentity("run", src.parent))
    streamer = Streamer("run", tmp_path / "state1", backend, journal,
                        node=NodeRank(1, 2, "test"))
    assert await streamer.stage(TAG, 4, src) is StageResult.STAGED
    await backend.claim_part(TAG, 1, await streamer.writer())
    with capture_logs() as logs:
        await streamer.release([TAG])
    assert [e for e in logs if e["event"].startswith("checkpoint_claim_release")] == []
    assert await backend.part_claim(TAG, 1) == await streamer.writer()
    journal.close()

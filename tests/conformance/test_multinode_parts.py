"""The multi-node half of the protocol on every store (tests/conformance/conftest.py):
part claims per node rank, files never stored over another host's, part manifests, the union
committed, nothing of a pruned checkpoint left behind; and the resume agreement, with its
reserved directory never taken for a checkpoint."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.conformance.conftest import Stores
from tests.conformance.test_protocol import _upload
from tests.support.sessions import RecordingSession

from traind.checkpoints.commit.lifecycle import PartsGoneError, PartsPendingError
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.layout.keys import AGREEMENT_DIR, PART_CLAIM_PREFIX
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.layout.parts import Part, PartsDisagreeError, part_name, union
from traind.protocol import CheckpointStore
from traind.protocol.listing_claims import CLAIMANTS
from traind.protocol.ownership import ConflictError
from traind.storage import LocalFile
from traind.util.nodes import NodeRank

W0, W1, OTHER = Writer("0" * 32, "node0"), Writer("1" * 32, "node1"), Writer("f" * 32, "x")
TAG = "checkpoint-4"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def part(rank: int, files: dict[str, bytes], writer: Writer) -> Part:
    """Node ``rank``'s part of TAG in a two-node job, listing ``files``."""
    entries = tuple(FileEntry(p, len(d), sha(d)) for p, d in sorted(files.items()))
    return Part("run", TAG, 4, rank, 2, writer, entries)


async def send(backend: CheckpointStore, root: Path,
               files: dict[str, bytes]) -> RecordingSession:
    """Write ``files`` under ``root`` and upload them as a part of TAG."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    session = RecordingSession()
    async with asyncio.timeout(60):
        await backend.upload_part(TAG, root, [LocalFile(p, len(d)) for p, d in files.items()],
                                  session)
    return session


async def test_each_rank_claims_its_own_part(stores: Stores) -> None:
    """Two hosts claim ranks 0 and 1 of one tag; a second writer for a rank is refused, a
    retried claim by its holder is not, and part_claim names each holder."""
    host0, host1, other = stores.checkpoints(), stores.checkpoints(), stores.checkpoints()
    async with asyncio.timeout(60):
        await host0.claim_part(TAG, 0, W0)
        await host1.claim_part(TAG, 1, W1)
        await host1.claim_part(TAG, 1, W1)
        with pytest.raises(ConflictError, match="belongs to writer 111111111111@node1"):
            await other.claim_part(TAG, 1, OTHER)
        assert await other.part_claim(TAG, 0) == W0
        assert await other.part_claim(TAG, 1) == W1
        assert await other.part_claim(TAG, 2) is None
    claims = [n for n in await stores.names(TAG) if not n.startswith("traind-claims-")]
    assert claims == ["traind-writer-0.json", "traind-writer-1.json"]  # S3's listing: claimants


async def test_single_writer_and_parts_never_share_a_tag(stores: Stores, tmp_path: Path) -> None:
    """A traind of one node cannot take a job's tag, nor a job's host one a single writer
    took; the refused claim leaves nothing behind."""
    host0, single = stores.checkpoints(), stores.checkpoints()
    async with asyncio.timeout(60):
        await host0.claim_part(TAG, 0, W0)
        with pytest.raises(ConflictError):
            await single.claim(TAG, OTHER)
        assert [n for n in await stores.names(TAG) if "claims" not in n] == ["traind-writer-0.json"]
        await single.claim("checkpoint-5", OTHER)
        if stores.staged:  # no claim object there: the commit holds the tag
            await single.commit(await _upload(single, tmp_path, {"x": b"x"}, OTHER,
                                              "checkpoint-5"))
        with pytest.raises(ConflictError):
            await host0.claim_part("checkpoint-5", 1, W1)
    assert "traind-writer-1.json" not in await stores.names("checkpoint-5")


async def test_same_path_is_stored_once_and_never_overwritten(
    stores: Stores, tmp_path: Path
) -> None:
    """The same relative path from three hosts: equal bytes are kept as stored, other bytes
    are refused (PartsDisagreeError) and the stored file is left untouched, with no
    temporary file left in the store."""
    hosts = [stores.checkpoints() for _ in range(3)]
    first = await send(hosts[0], tmp_path / "a", {"config.json": b"same", "__0_0.distcp": b"0"})
    again = await send(hosts[1], tmp_path / "b", {"config.json": b"same", "__1_0.distcp": b"1"})
    assert first.done["config.json"] == again.done["config.json"] == sha(b"same")
    assert set(again.done) == {"config.json", "__1_0.distcp"}
    with pytest.raises(PartsDisagreeError, match=r"config\.json in the store"):
        await send(hosts[2], tmp_path / "c", {"config.json": b"diff"})
    with pytest.raises(PartsDisagreeError, match=r"config\.json in the store"):
        await send(hosts[2], tmp_path / "d", {"config.json": b"other length"})
    assert await stores.names(TAG) == ["__0_0.distcp", "__1_0.distcp", "config.json"]
    manifest = Manifest("run", TAG, 4, (FileEntry("config.json", 4, sha(b"same")),), writer=W0)
    async with asyncio.timeout(60):
        got = await hosts[2].download(manifest, tmp_path / "restored", lambda n: None)
    assert got == {"config.json": sha(b"same")}


async def test_parts_committed_as_their_union_then_deleted_whole(
    stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part manifests are listed by rank and read back as stored; the union committed by the
    last host is what ``committed`` reads on the other; deleting the checkpoint removes the
    part manifests first and leaves no part, claim or file of it."""
    host0, host1 = stores.checkpoints(), stores.checkpoints()
    files0 = {"__0_0.distcp": b"zero", ".metadata": b"meta", "config.json": b"{}"}
    files1 = {"__1_0.distcp": b"one", "config.json": b"{}"}
    part0, part1 = part(0, files0, W0), part(1, files1, W1)
    async with asyncio.timeout(90):
        assert await host0.part_ranks(TAG) == set()
        await host0.claim_part(TAG, 0, W0)
        await send(host0, tmp_path / "a", files0)
        await host0.commit_part(part0)
        assert await host0.part_ranks(TAG) == {0}
        assert await host1.committed(TAG) is None
        await host1.claim_part(TAG, 1, W1)
        await send(host1, tmp_path / "b", files1)
        await host1.commit_part(part1)
        assert await host1.part_ranks(TAG) == {0, 1}
        stored = sorted(await host1.parts(TAG), key=lambda p: p.node_rank)
        assert stored == [part0, part1]
        whole = union(TAG, stored, 2, W1)
        assert isinstance(whole, Manifest)
        await host1.commit_union(whole)
        assert await host0.committed(TAG) == whole
        assert [m.tag for m in await host0.manifests()] == [TAG]
        deleted: list[list[str]] = []
        objects, delete = host0.objects, host0.objects.delete

        async def spy(keys: Sequence[str]) -> None:
            deleted.append([k.rsplit("/", 1)[-1] for k in keys])
            await delete(keys)

        monkeypatch.setattr(objects, "delete", spy)
        await host0.delete(TAG)
        # Part manifests before the manifest: a host whose part waited never sees the union
        # uncommitted with every part still in (it would commit it again).
        assert {part_name(0), part_name(1)} <= set(deleted[0])
        assert await host1.part_ranks(TAG) == set()
        assert await host1.part_claim(TAG, 0) is None
        assert await host1.committed(TAG) is None
    assert await stores.names(TAG) == []


async def staged_host(tmp_path: Path, rank: int,
                      backend: CheckpointStore) -> tuple[Streamer, Journal]:
    """Host ``rank`` of a two-node job with its own part of TAG (one DCP file) staged."""
    src = tmp_path / f"out{rank}" / TAG
    src.mkdir(parents=True)
    (src / f"__{rank}_0.distcp").write_bytes(b"x" * (rank + 1))
    journal = Journal(tmp_path / f"state{rank}" / "journal.sqlite3",
                      RunIdentity("run", src.parent))
    streamer = Streamer("run", tmp_path / f"state{rank}", backend, journal,
                        node=NodeRank(rank, 2, "test"))
    assert await streamer.stage(TAG, 4, src) is StageResult.STAGED
    return streamer, journal


async def test_part_pruned_while_waiting_leaves_no_orphan(
    stores: Stores, tmp_path: Path
) -> None:
    """Through the streamer: the host whose part waited learns of the commit, and once
    node 0 pruned the checkpoint, claims nothing again: no orphan part in the store."""
    hosts = [await staged_host(tmp_path, rank, stores.checkpoints()) for rank in (0, 1)]
    try:
        async with asyncio.timeout(90):
            with pytest.raises(PartsPendingError):
                await hosts[1][0].commit(TAG)
            committed = await hosts[0][0].commit(TAG)  # the last part in: the union
            assert sorted(f.path for f in committed.files) == ["__0_0.distcp",
                                                               "__1_0.distcp"]
            await hosts[0][0].storage.delete(TAG)  # node 0's retention
            with pytest.raises(PartsGoneError):
                await hosts[1][0].commit(TAG)
    finally:
        for _, journal in hosts:
            journal.close()
    assert await stores.names(TAG) == []


async def test_part_rechecked_while_node_0_prunes_it_claims_nothing(
    stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose part waited looks again while node 0's delete of the committed
    checkpoint has removed all but the claims, and the delete ends right after the host read
    its claim: its part is gone, and it claims and stores nothing again."""
    hosts = [await staged_host(tmp_path, rank, stores.checkpoints()) for rank in (0, 1)]
    raw, base = stores.make(), f"{TAG}/"
    host1 = hosts[1][0].storage
    read = host1.part_claim

    async def read_then_deleted(tag: str, rank: int) -> Writer | None:
        found = await read(tag, rank)
        await hosts[0][0].storage.delete(tag)  # node 0's delete ends meanwhile
        return found

    try:
        async with asyncio.timeout(90):
            with pytest.raises(PartsPendingError):
                await hosts[1][0].commit(TAG)
            await hosts[0][0].commit(TAG)
            claims = {m.key for m in await raw.list(base)
                      if m.key[len(base):].startswith((PART_CLAIM_PREFIX, CLAIMANTS))}
            await raw.delete(sorted({m.key for m in await raw.list(base)} - claims))
            monkeypatch.setattr(host1, "part_claim", read_then_deleted)
            with pytest.raises(PartsGoneError):
                await hosts[1][0].commit(TAG)
    finally:
        for _, journal in hosts:
            journal.close()
    assert await stores.names(TAG) == []


async def test_start_requests_and_board_round_trip(stores: Stores) -> None:
    """Each rank's start request replaces its last one and is listed by every host; a
    withdraw of a nonce no longer there leaves the request; the board is None until
    written, then read back as last written; nothing else is left beside them."""
    host0, host1, node0 = stores.checkpoints(), stores.checkpoints(), stores.checkpoints()
    async with asyncio.timeout(60):
        assert await node0.start_requests() == {}
        assert await host1.read_board() is None
        await host0.request_start(0, "a" * 32)
        await host1.request_start(1, "b" * 32)
        await host1.request_start(1, "c" * 32)
        await host1.request_start(1, "c" * 32)  # a killed daemon asking again, same nonce
        assert await node0.start_requests() == {0: "a" * 32, 1: "c" * 32}
        await host1.withdraw_start(1, "b" * 32)
        assert await node0.start_requests() == {0: "a" * 32, 1: "c" * 32}
        await host1.withdraw_start(1, "c" * 32)
        assert await node0.start_requests() == {0: "a" * 32}
        await node0.write_board(b'{"round": 1}')
        assert await host1.read_board() == b'{"round": 1}'
        await node0.write_board(b'{"round": 2}')
        assert await host0.read_board() == b'{"round": 2}'
    left = await stores.names(AGREEMENT_DIR)
    assert "board.json" in left
    assert len(left) == 2, left  # node 0's one request and the board: no temporary file


async def test_a_request_being_written_is_not_listed(stores: Stores) -> None:
    """A request whose put has not finished (on local and SSH stores, its temporary name
    ``start-<rank>-<nonce>.<token>.traind-part``) is not taken for a request with that
    name as its nonce."""
    node0 = stores.checkpoints()
    async with asyncio.timeout(60):
        await node0.request_start(0, "a" * 32)
        await stores.make().put(f"{AGREEMENT_DIR}/start-1-{'b' * 32}.0123456789ab.traind-part",
                                b"")
        assert await node0.start_requests() == {0: "a" * 32}


async def test_reserved_dir_is_never_a_checkpoint(stores: Stores, tmp_path: Path) -> None:
    """With requests and a board stored beside the tags, manifests() (what retention
    prunes from) lists only the committed tag, uncommitted() only the tag whose parts wait,
    and deleting both tags leaves the agreement as it was."""
    host0, host1 = stores.checkpoints(), stores.checkpoints()
    async with asyncio.timeout(90):
        await host0.request_start(0, "a" * 32)
        await host1.request_start(1, "b" * 32)
        await host0.write_board(b"{}")
        files0 = {"__0_0.distcp": b"zero"}
        await host0.claim_part(TAG, 0, W0)
        await send(host0, tmp_path / "a", files0)
        await host0.commit_part(part0 := part(0, files0, W0))
        await host0.commit(await _upload(host0, tmp_path / "c", {"x": b"x"}, W0,
                                         "checkpoint-5"))
        assert [m.tag for m in await host1.manifests()] == ["checkpoint-5"]
        assert await host1.uncommitted() == {TAG: [part0]}
        for tag in (TAG, "checkpoint-5"):
            await host0.delete(tag)
        assert await host1.manifests() == []
        assert await host1.uncommitted() == {}
        assert await host1.start_requests() == {0: "a" * 32, 1: "b" * 32}
        assert await host1.read_board() == b"{}"


async def test_uncommitted_lists_tags_whose_parts_wait(stores: Stores, tmp_path: Path) -> None:
    """uncommitted() holds each tag with parts and no manifest, with those parts as
    stored; once the union is committed the tag is no longer there."""
    host0, host1 = stores.checkpoints(), stores.checkpoints()
    files0, files1 = {"__0_0.distcp": b"zero"}, {"__1_0.distcp": b"one"}
    part0, part1 = part(0, files0, W0), part(1, files1, W1)
    async with asyncio.timeout(90):
        assert await host0.uncommitted() == {}
        await host0.claim_part(TAG, 0, W0)
        await send(host0, tmp_path / "a", files0)
        await host0.commit_part(part0)
        assert await host1.uncommitted() == {TAG: [part0]}
        await host1.claim_part(TAG, 1, W1)
        await send(host1, tmp_path / "b", files1)
        await host1.commit_part(part1)
        found = await host0.uncommitted()
        assert sorted(found[TAG], key=lambda p: p.node_rank) == [part0, part1]
        whole = union(TAG, found[TAG], 2, W1)
        assert isinstance(whole, Manifest)
        await host1.commit_union(whole)
        assert await host0.uncommitted() == {}


async def test_one_path_sent_by_two_hosts_at_once_lands_whole(
    stores: Stores, tmp_path: Path
) -> None:
    """Two hosts send the same path (the config.json every node saves) at the same instant:
    both sends succeed, the stored file is whole, and no temporary file is left."""
    hosts = [stores.checkpoints() for _ in range(2)]
    data = bytes(range(256)) * 8192
    async with asyncio.timeout(60):
        sessions = await asyncio.gather(*(
            send(host, tmp_path / f"h{rank}", {"config.json": data, f"__{rank}_0.distcp": b"x"})
            for rank, host in enumerate(hosts)))
        stored = await stores.make().get(f"{TAG}/config.json")
    assert all(s.done["config.json"] == sha(data) for s in sessions)
    assert await stores.names(TAG) == ["__0_0.distcp", "__1_0.distcp", "config.json"]
    assert stored is not None
    assert stored.data == data

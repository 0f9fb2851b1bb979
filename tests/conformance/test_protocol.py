"""The single-writer protocol on every store (tests/conformance/conftest.py): racing claims,
leases renewed and taken over after a writer dies, the commit's check at the store, the
manifest created once, and deletes that leave nothing — the same tests on each store."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest
from tests.conformance.conftest import Stores, claiming, staging
from tests.conformance.test_primitives import ODD_NAMES, _write
from tests.support.sessions import RecordingSession

from traind.errors import MissingFilesError
from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore
from traind.protocol.listing_claims import CLAIMANTS
from traind.protocol.ownership import ClaimHeldError, ConflictError, Lease
from traind.storage.base import Blob

TAG = "checkpoint-7"
WRITERS = [Writer(f"{n:032x}", f"host-{n}") for n in range(4)]
A, B = WRITERS[0], WRITERS[1]


async def _upload(store: CheckpointStore, root: Path, files: dict[str, bytes],
                  writer: Writer, tag: str = TAG) -> Manifest:
    """Claim ``tag``, send ``files`` and return the manifest that would commit them."""
    local = _write(root, files)
    session = RecordingSession()
    await store.claim(tag, writer)
    await store.upload(tag, root, local, session)
    entries = tuple(FileEntry(f.path, f.size, session.done[f.path]) for f in local)
    return Manifest("run", tag, int(tag.rsplit("-", 1)[1]), entries, writer=writer)


@claiming
async def test_racing_claims_one_wins_every_round(stores: Stores) -> None:
    """Four writers claim one tag at the same instant, five rounds: exactly one gets it each
    time and the others are told who holds it — on stores without atomic creates too, where
    the listed claims resolve the race (jittered retries, no lockstep)."""
    handles = [stores.checkpoints() for _ in WRITERS]
    for round_ in range(5):
        tag = f"checkpoint-{round_ + 1}"
        async with asyncio.timeout(90):
            results = await asyncio.gather(
                *(h.claim(tag, w) for h, w in zip(handles, WRITERS, strict=True)),
                return_exceptions=True)
        winners = [w for w, r in zip(WRITERS, results, strict=True) if r is None]
        assert len(winners) == 1, results
        assert all(isinstance(r, ClaimHeldError) and r.theirs == str(winners[0])
                   for r in results if r is not None), results


async def test_racing_writers_one_commits_every_round(stores: Stores, tmp_path: Path) -> None:
    """Four writers claim, send and commit one tag at the same instant, three rounds: one
    checkpoint is committed, its writer's, and every other writer is told who has it (at
    the claim where a claim object holds the tag, at the commit where the commit decides)."""
    handles = [stores.checkpoints() for _ in WRITERS]

    async def write(store: CheckpointStore, writer: Writer, tag: str) -> None:
        root = tmp_path / tag / writer.id
        await store.commit(await _upload(store, root, {"w.bin": writer.id.encode()}, writer,
                                         tag))

    for round_ in range(3):
        tag = f"checkpoint-{round_ + 1}"
        async with asyncio.timeout(90):
            results = await asyncio.gather(
                *(write(h, w, tag) for h, w in zip(handles, WRITERS, strict=True)),
                return_exceptions=True)
        committed = await handles[0].committed(tag)
        assert committed is not None
        assert [w for w, r in zip(WRITERS, results, strict=True) if r is None] == [
            committed.writer], results
        assert all(isinstance(r, ConflictError) and r.theirs == str(committed.writer)
                   for r in results if r is not None), results


@staging
async def test_staged_files_are_the_senders_until_committed(stores: Stores,
                                                            tmp_path: Path) -> None:
    """What a writer sent and did not commit is nobody's: a restarted writer (a new handle)
    is told its files are missing and sends them again, another writer commits the tag at
    once, with no claim to wait out, and the committed tag holds its files and manifest
    alone."""
    a = stores.checkpoints()
    async with asyncio.timeout(60):
        manifest = await _upload(a, tmp_path / "a", {"x.bin": b"x" * 64, "y.bin": b"y"}, A)
        assert await stores.names(TAG) == []
        restarted = stores.checkpoints()
        with pytest.raises(MissingFilesError) as missing:
            await restarted.commit(manifest)
        assert sorted(missing.value.paths) == ["x.bin", "y.bin"]
        b = stores.checkpoints()
        await b.commit(await _upload(b, tmp_path / "b", {"z.bin": b"z"}, B))
        with pytest.raises(ConflictError) as lost:
            await a.commit(manifest)
        assert lost.value.theirs == str(B)
        assert await stores.names(TAG) == [MANIFEST_NAME, "z.bin"]


@claiming
async def test_a_dead_writers_claim_is_taken_over(stores: Stores, tmp_path: Path) -> None:
    """A's upload stops half-way (killed, its lease no longer renewed); once stale, B takes
    the claim over: A's objects are removed, B commits, and A's next renewal learns it lost
    the tag (ConflictError)."""
    a, b = stores.checkpoints(), stores.checkpoints()
    async with asyncio.timeout(60):
        await _upload(a, tmp_path / "a", {"half.bin": b"A" * 100}, A)
        await a.renew(TAG, A)
        with pytest.raises(ClaimHeldError) as held:
            await b.claim(TAG, B)
        lease = held.value.lease
        assert not lease.stale(60.0)
        assert lease.stale(0.0, now=time.time() + 1.0)
        assert await b.take_over(TAG, lease, B)
        assert not await stores.checkpoints().take_over(TAG, lease, WRITERS[2])  # once
        assert "half.bin" not in await stores.names(TAG)
        mine = await _upload(b, tmp_path / "b", {"whole.bin": b"B" * 10}, B)
        await b.commit(mine)
        with pytest.raises(ConflictError):
            await a.renew(TAG, A)
        assert [m.writer for m in await a.manifests()] == [B]


@claiming
async def test_a_released_claim_is_stale_at_once(stores: Stores) -> None:
    """A writer stopping with its tag unstored releases the claim: the next writer finds it
    stale without waiting; releasing another writer's claim does nothing."""
    a, b = stores.checkpoints(), stores.checkpoints()
    async with asyncio.timeout(60):
        await a.claim(TAG, A)
        await b.release(TAG, B)
        with pytest.raises(ClaimHeldError) as fresh:
            await b.claim(TAG, B)
        assert not fresh.value.lease.stale(60.0)
        await a.release(TAG, A)
        with pytest.raises(ClaimHeldError) as released:
            await b.claim(TAG, B)
        assert released.value.lease.stale(60.0)
        assert released.value.lease.renewed_at == 0.0


@claiming
async def test_a_file_removed_before_commit_stops_it(stores: Stores, tmp_path: Path) -> None:
    """A file removed from the store between its upload and the commit (whatever the
    transfer reported) stops the commit with an error naming it, and no manifest is
    written; sent again, the checkpoint commits."""
    store = stores.checkpoints()
    files = {"model.bin": b"m" * 4096, "optimizer.bin": b"o" * 2048}
    async with asyncio.timeout(60):
        manifest = await _upload(store, tmp_path / "src", files, A)
        await stores.make().delete([f"{TAG}/optimizer.bin"])
        with pytest.raises(MissingFilesError, match=r"optimizer\.bin") as missing:
            await store.commit(manifest)
        assert missing.value.paths == ["optimizer.bin"]
        assert await store.committed(TAG) is None
        assert MANIFEST_NAME not in await stores.names(TAG)
        session = RecordingSession()
        await store.upload(TAG, tmp_path / "src", _write(tmp_path / "src", {
            "optimizer.bin": files["optimizer.bin"]}), session)
        await store.commit(manifest)
        assert await store.committed(TAG) == manifest


async def test_odd_names_commit_whole_and_come_back(stores: Stores, tmp_path: Path) -> None:
    """A checkpoint of files named with a leading ``#``, ``;``, ``-``, ``~``, spaces and
    Unicode is committed whole (every transfer mode) and restored byte for byte."""
    store = stores.checkpoints()
    files = {name: name.encode() * 3 for name in ODD_NAMES}
    async with asyncio.timeout(60):
        manifest = await _upload(store, tmp_path / "src", files, A)
        await store.commit(manifest)
        back = await store.download(manifest, tmp_path / "back", lambda n: None)
    assert back == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}


async def test_the_manifest_is_one_writers(stores: Stores, tmp_path: Path) -> None:
    """A commit never replaces another writer's manifest (ConflictError carrying it); its
    own, retried, it may; a claim on a committed tag by another writer is refused."""
    store = stores.checkpoints()
    async with asyncio.timeout(60):
        ours = await _upload(store, tmp_path / "src", {"x.bin": b"x"}, A)
        await store.commit(ours)
        await store.commit(ours)
        with pytest.raises(ConflictError) as theirs:
            await stores.checkpoints().commit(Manifest("run", TAG, 7, (), writer=B))
        assert theirs.value.committed == ours
        with pytest.raises(ConflictError) as claimed:
            await stores.checkpoints().claim(TAG, B)
        assert claimed.value.committed == ours
        assert [m.writer for m in await store.manifests()] == [A]


@claiming
async def test_a_manifest_that_outlived_its_claim_is_its_writers(stores: Stores,
                                                                 tmp_path: Path) -> None:
    """A committed checkpoint whose claim is gone (a stale writer's manifest landing after a
    takeover removed its claim) stays its writer's: another's claim is refused, carrying
    the manifest, and withdrawn."""
    store = stores.checkpoints()
    async with asyncio.timeout(60):
        ours = await _upload(store, tmp_path / "src", {"x.bin": b"x"}, A)
        await store.commit(ours)
        await store.objects.delete([f"{TAG}/{n}" for n in await stores.names(TAG)
                                    if n == CLAIM_NAME or n.startswith(CLAIMANTS)])
        with pytest.raises(ConflictError) as claimed:
            await stores.checkpoints().claim(TAG, B)
        assert claimed.value.committed == ours
        assert CLAIM_NAME not in await stores.names(TAG)
        assert await store.manifests() == [ours]


async def test_delete_leaves_nothing_and_frees_the_tag(stores: Stores, tmp_path: Path) -> None:
    """Deleting a committed checkpoint removes its manifest, files and claims: nothing is
    listed under the tag, and another writer may claim it afresh."""
    store = stores.checkpoints()
    async with asyncio.timeout(60):
        manifest = await _upload(store, tmp_path / "src",
                                 {"a.bin": b"a", "sub/b.bin": b"bb"}, A)
        await store.commit(manifest)
        await store.delete(TAG)
        assert await stores.names(TAG) == []
        assert await store.manifests() == []
        await stores.checkpoints().claim(TAG, B)
        assert (CLAIM_NAME in await stores.names(TAG)) != stores.staged  # staged: no claims


@claiming
async def test_a_taken_over_claim_is_renewed_by_no_one_else(stores: Stores) -> None:
    """Renewals keep the claim the holder's: another writer renewing it is refused, and a
    lease read back is the holder's with a later renewal time."""
    a = stores.checkpoints()
    async with asyncio.timeout(60):
        await a.claim(TAG, A)
        first = Lease.from_json((await _claim(stores)).data)
        await asyncio.sleep(0.02)
        await a.renew(TAG, A)
        second = Lease.from_json((await _claim(stores)).data)
        with pytest.raises(ConflictError):
            await stores.checkpoints().renew(TAG, B)
    assert second.writer == A
    assert second.nonce == first.nonce
    assert second.renewed_at > first.renewed_at


async def _claim(stores: Stores) -> Blob:
    found = await stores.make().get(f"{TAG}/{CLAIM_NAME}")
    assert found is not None
    return found


@claiming
async def test_a_killed_writers_temporary_file_goes_with_the_commit(
    stores: Stores, tmp_path: Path,
) -> None:
    """A temporary file a killed upload left under the tag (its writer restarted and sent
    the file whole) is removed when the checkpoint commits; a checkpoint file of that
    name stays."""
    store = stores.checkpoints()
    files = {"model.bin": b"m" * 100, "kept.traind-part": b"a real file"}
    async with asyncio.timeout(60):
        manifest = await _upload(store, tmp_path / "src", files, A)
        await stores.make().put(f"{TAG}/model.bin.0123456789ab.traind-part", b"m" * 10)
        await store.commit(manifest)
        names = await stores.names(TAG)
    assert "model.bin.0123456789ab.traind-part" not in names
    assert "kept.traind-part" in names

"""A claim is a lease, on the local store and the in-memory fake: a dead writer's claim
without a manifest goes stale and is taken over, a live one is waited on, never taken."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.writers import (
    check_own_bytes,
    close,
    commit_when_stale,
    dead_writer,
    side,
)

from traind.config import LocalStorage
from traind.layout.keys import CLAIM_NAME
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore, open_storage
from traind.protocol.ownership import ClaimHeldError, ConflictError, Lease
from traind.protocol.testing import MemoryBackend

TAG = "checkpoint-1"


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """One store (local directory or the fake) the writers of a test share."""
    if request.param == "local":
        return open_storage(LocalStorage(path=tmp_path / "store"), "run1")
    return MemoryBackend("run1")


def left_in_store(store: CheckpointStore, tmp_path: Path) -> set[str]:
    """The names of everything under checkpoint-1 in the store."""
    if isinstance(store, MemoryBackend):
        return {k.split("/", 1)[1] for k in store.memory.objects if k.startswith(f"{TAG}/")}
    return {p.name for p in (tmp_path / "store" / "run1" / TAG).iterdir()}


async def test_a_dead_writers_claim_is_taken_over_once_stale(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """A writer that died mid-upload: the next writer waits (checkpoint_claim_held once,
    journal 'ready') while the claim is fresh, then takes it over (error-level
    checkpoint_claim_taken_over) and commits its own bytes; no object of the dead one is left."""
    dead = await dead_writer(tmp_path, store)
    fresh = await side(tmp_path, "b", store, steps=1, claim_ttl=4.0)
    try:
        with capture_logs() as logs:
            for _ in range(2):
                with pytest.raises(ClaimHeldError) as held:
                    await fresh.streamer.commit(TAG)
            assert held.value.theirs == str(dead.writer)
            entry = await fresh.journal.get(TAG)
            assert entry is not None
            assert entry.state == "ready"
            assert fresh.streamer.held[TAG].writer == dead.writer
            await commit_when_stale(fresh, TAG)
        await check_own_bytes(fresh, store, TAG, tmp_path)
    finally:
        close([dead, fresh])
    waits = [e for e in logs if e["event"] == "checkpoint_claim_held"]
    assert len(waits) == 1
    assert waits[0]["holder"] == str(dead.writer)
    assert 0 < waits[0]["stale_in"] <= 4.0
    taken = [e for e in logs if e["event"] == "checkpoint_claim_taken_over"]
    assert [(e["log_level"], e["holder"]) for e in taken] == [("error", str(dead.writer))]
    assert fresh.streamer.held == {}
    assert "dead-only.bin" not in left_in_store(store, tmp_path)
    assert "dead-only.bin" in dead.written[TAG]


async def test_two_takers_of_a_stale_claim_one_wins(
    store: CheckpointStore, tmp_path: Path,
) -> None:
    """Two writers meeting one stale claim at once: exactly one takes it over and commits,
    the other then meets that commit as a conflict; the dead writer's objects are gone."""
    dead = await dead_writer(tmp_path, store)
    sides = [await side(tmp_path, name, store, steps=1, claim_ttl=1.0) for name in "bc"]
    await asyncio.sleep(1.2)
    try:
        with capture_logs() as logs:
            outcomes = await asyncio.gather(*(commit_when_stale(s, TAG) for s in sides),
                                            return_exceptions=True)
        won = [s for s, o in zip(sides, outcomes, strict=True) if isinstance(o, Manifest)]
        lost = [o for o in outcomes if isinstance(o, ConflictError)]
        assert len(won) == 1, outcomes
        assert len(lost) == 1, outcomes
        assert lost[0].committed is not None
        await check_own_bytes(won[0], store, TAG, tmp_path)
    finally:
        close([dead, *sides])
    assert len([e for e in logs if e["event"] == "checkpoint_claim_taken_over"]) == 1
    assert "dead-only.bin" not in left_in_store(store, tmp_path)


async def test_a_live_writers_claim_is_renewed_not_taken(
    store: CheckpointStore, tmp_path: Path,
) -> None:
    """A writer whose upload outlasts claim_ttl renews its claim meanwhile: the other
    writer waits for it and then meets its commit (a conflict), never taking it over."""
    slow = await side(tmp_path, "slow", store, steps=1, claim_ttl=1.0)
    other = await side(tmp_path, "other", store, steps=1, claim_ttl=1.0)
    release = asyncio.Event()
    upload = store.upload

    async def slow_upload(*args: object, **kwargs: object) -> None:
        await asyncio.wait_for(release.wait(), 30)  # the upload takes 3 claim_ttls
        await upload(*args, **kwargs)  # type: ignore[arg-type]

    try:
        with capture_logs() as logs:
            store.upload = slow_upload  # type: ignore[method-assign]
            committing = asyncio.create_task(slow.streamer.commit("checkpoint-1"))
            for _ in range(15):  # 3 s: three claim_ttls
                await asyncio.sleep(0.2)
                with pytest.raises(ClaimHeldError):
                    await other.streamer.commit("checkpoint-1")
            release.set()
            await asyncio.wait_for(committing, 30)
            with pytest.raises(ConflictError) as lost:
                await other.streamer.commit("checkpoint-1")
        assert lost.value.committed is not None
        await check_own_bytes(slow, store, "checkpoint-1", tmp_path)
    finally:
        release.set()
        close([slow, other])
    assert not [e for e in logs if e["event"] == "checkpoint_claim_taken_over"]


async def test_a_released_claim_is_taken_over_at_once(
    store: CheckpointStore, tmp_path: Path,
) -> None:
    """A writer stopping with a tag unstored releases its claim: the next writer takes it
    over without waiting claim_ttl (here ten minutes); another's claim is not released."""
    dead = await dead_writer(tmp_path, store)
    fresh = await side(tmp_path, "b", store, steps=1)
    stranger = await side(tmp_path, "stranger", store, steps=0)
    try:
        await stranger.streamer.release([TAG])  # not its claim: left alone
        with pytest.raises(ClaimHeldError):
            await fresh.streamer.commit(TAG)
        await dead.streamer.release([TAG, "checkpoint-2"])  # unclaimed checkpoint-2: nothing
        async with asyncio.timeout(30):
            await fresh.streamer.commit(TAG)
        await check_own_bytes(fresh, store, TAG, tmp_path)
    finally:
        close([dead, fresh, stranger])
    assert "dead-only.bin" not in left_in_store(store, tmp_path)


async def test_a_writer_whose_claim_was_taken_over_stops(
    store: CheckpointStore, tmp_path: Path,
) -> None:
    """A writer that did not renew in time (the other's claim_ttl is shorter than its
    renewal interval) finds at its next renewal that the tag is another's: its upload is
    stopped, it never commits, journals 'conflict'; the taker's checkpoint is whole."""
    stalled = await side(tmp_path, "stalled", store, steps=1, claim_ttl=4.0)  # renews each 1 s
    taker = await side(tmp_path, "taker", store, steps=1, claim_ttl=0.3)
    never = asyncio.Event()
    upload = store.upload

    async def stuck_upload(*args: object, **kwargs: object) -> None:
        await asyncio.wait_for(never.wait(), 30)  # an upload that hangs past the takeover
        await upload(*args, **kwargs)  # type: ignore[arg-type]

    try:
        store.upload = stuck_upload  # type: ignore[method-assign]
        committing = asyncio.create_task(stalled.streamer.commit(TAG))
        await asyncio.sleep(0.5)
        store.upload = upload  # type: ignore[method-assign]
        with capture_logs() as logs:
            await commit_when_stale(taker, TAG, within=30)
            with pytest.raises(ConflictError) as lost:
                await asyncio.wait_for(committing, 10)
        assert lost.value.theirs == str(taker.writer)
        entry = await stalled.journal.get(TAG)
        assert entry is not None
        assert entry.state == "conflict"
        await check_own_bytes(taker, store, TAG, tmp_path)
    finally:
        never.set()
        close([stalled, taker])
    assert [e["tag"] for e in logs if e["event"] == "checkpoint_claim_taken_over"] == [TAG]


async def test_a_writer_that_lost_its_claim_sends_no_further_file(tmp_path: Path) -> None:
    """Between files the writer checks the claim is still its own: taken over after its
    first file, it sends none of the others and journals 'conflict'."""
    store = open_storage(LocalStorage(path=tmp_path / "store", concurrency=1), "run1")
    loser = await side(tmp_path, "loser", store, steps=1)
    taker = await side(tmp_path, "taker", store, steps=0)
    file_done = loser.journal.file_done
    sent: list[str] = []

    async def taken_after_first(tag: str, path: str, sha256: str) -> None:
        await file_done(tag, path, sha256)
        sent.append(path)
        if len(sent) == 1:  # the claim goes to another writer (as a takeover would)
            lease = Lease.from_json((tmp_path / "store" / "run1" / TAG / CLAIM_NAME).read_bytes())
            assert await store.take_over(TAG, lease, taker.writer)
            await store.claim(TAG, taker.writer)
            await asyncio.sleep(1.1)  # past the throttle of the between-files check

    try:
        loser.journal.file_done = taken_after_first  # type: ignore[method-assign]
        with pytest.raises(ConflictError) as lost:
            await asyncio.wait_for(loser.streamer.commit(TAG), 30)
        assert lost.value.theirs == str(taker.writer)
        entry = await loser.journal.get(TAG)
        assert entry is not None
        assert entry.state == "conflict"
    finally:
        close([loser, taker])
    assert len(sent) == 1
    left = {p.name for p in (tmp_path / "store" / "run1" / TAG).iterdir()}
    assert left - {n for n in left if n.startswith("traind-takeover-")} == {CLAIM_NAME}


async def test_renewals_of_a_claim_never_overlap(
    store: CheckpointStore, tmp_path: Path,
) -> None:
    """The lease's timer, the check between files and the renewal before the commit take
    turns: two renewals at once would race each other's write of the claim."""
    writer = await side(tmp_path, "a", store, steps=1, claim_ttl=0.2)
    renew = store.renew
    running = 0
    most = 0
    renewals = 0

    async def slow_renew(*args: object, **kwargs: object) -> None:
        nonlocal running, most, renewals
        running += 1
        renewals += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.1)  # a store slower than the lease's timer
            await renew(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            running -= 1

    upload = store.upload

    async def slow_upload(*args: object, **kwargs: object) -> None:
        await asyncio.sleep(1.5)  # renewals come from the timer meanwhile
        await upload(*args, **kwargs)  # type: ignore[arg-type]

    store.renew = slow_renew  # type: ignore[method-assign]
    store.upload = slow_upload  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(writer.streamer.commit(TAG), 60)
    finally:
        close([writer])
    assert renewals >= 3
    assert most == 1, f"{most} renewals of one claim ran at once"

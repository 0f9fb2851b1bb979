"""Two writers, one namespace, on real SeaweedFS: with conditional writes (If-None-Match)
and with the listing fallback for stores that ignore them (switched off, or really dropped
on the way by a proxy)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.integration.s3.conftest import s3_config
from tests.support.checkpoints import one_file
from tests.support.s3proxy import throttling_proxy
from tests.support.seaweed import SeaweedS3
from tests.support.writers import check_one_writer_each, close, race

from traind.config import S3Storage
from traind.errors import TransientStorageError
from traind.layout.manifest import Manifest, Writer
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ConflictError
from traind.storage.s3 import conditional


async def test_probe_says_which_claim_the_store_gets(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    claim_mode: str,
) -> None:
    """SeaweedFS refuses a second If-None-Match put: the probe reports conditional writes
    (or the listing protocol when they are switched off)."""
    backend = backends(s3_config(s3_server, bucket))
    async with asyncio.timeout(30):
        claim = await backend.probe()
    assert claim == (conditional.CONDITIONAL if claim_mode == "conditional" else conditional.LISTED)
    listing = s3_server.client().list_objects_v2(Bucket=bucket)
    assert listing.get("KeyCount", 0) == 0  # the probe objects are gone


async def test_two_streamers_same_tags_one_writer_each(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    tmp_path: Path, claim_mode: str,
) -> None:
    """Two writers racing for checkpoint-1..3 on S3: each tag one writer's, whole and
    restorable; the other told, its copies kept."""
    config = s3_config(s3_server, bucket)
    sides = await race(tmp_path, (backends(config), backends(config)))
    try:
        await check_one_writer_each(sides, backends(config), tmp_path)
    finally:
        close(sides)


async def test_racing_claims_exactly_one_wins(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    claim_mode: str,
) -> None:
    """Eight writers (own clients) claiming one tag at once: one wins, the rest conflict
    (with the listing protocol two that withdrew together retry, as the streamer does)."""
    config = s3_config(s3_server, bucket)
    await check_one_claim_wins([backends(config) for _ in range(8)])


async def check_one_claim_wins(stores: list[CheckpointStore]) -> None:
    """One writer per store claims checkpoint-9 at once: exactly one wins, every other is
    told who did."""
    writers = [Writer(f"{n:032x}", f"host-{n}") for n in range(len(stores))]

    async def claim(store: CheckpointStore, writer: Writer) -> BaseException | None:
        for _ in range(10):
            try:
                await store.claim("checkpoint-9", writer)
                return None
            except ConflictError as exc:
                return exc
            except TransientStorageError:  # two withdrew at once: retried, as the streamer does
                await asyncio.sleep(0.1 + 0.05 * writers.index(writer))
        raise AssertionError("never decided")

    async with asyncio.timeout(90):
        results = await asyncio.gather(*(claim(s, w) for s, w in zip(stores, writers,
                                                                      strict=True)))
    winners = [w for w, r in zip(writers, results, strict=True) if r is None]
    assert len(winners) == 1
    assert all(isinstance(r, ConflictError) and r.theirs == str(winners[0])
               for r in results if r is not None)


async def test_a_store_that_drops_conditions_is_found_and_claims_are_listed(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that really ignores If-None-Match (a proxy drops it from every put before
    SeaweedFS sees it): the probe finds so and says claims are listed, and of eight writers
    racing for one tag exactly one still wins."""
    monkeypatch.delenv("TRAIND_S3_CONDITIONAL", raising=False)
    async with throttling_proxy(s3_server.endpoint, ignore_conditions=True) as proxy:
        config = s3_config(s3_server, bucket, endpoint_url=proxy.endpoint)
        async with asyncio.timeout(30):
            claim = await backends(config).probe()
        assert (claim, proxy.dropped) == (conditional.LISTED, 2)  # the probe object's puts
        await check_one_claim_wins([backends(config) for _ in range(8)])


async def test_manifest_is_created_once(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    claim_mode: str,
) -> None:
    """A commit never replaces another writer's manifest on S3; a retry of its own may."""
    store = backends(s3_config(s3_server, bucket))
    a, b = Writer("a" * 32, "host-a"), Writer("b" * 32, "host-b")
    async with asyncio.timeout(30):
        files = await one_file(store, "checkpoint-1")
        await store.commit(Manifest("run1", "checkpoint-1", 1, files, writer=a))
        with pytest.raises(ConflictError):
            await store.commit(Manifest("run1", "checkpoint-1", 1, files, writer=b))
        await store.commit(Manifest("run1", "checkpoint-1", 1, files, writer=a))
        assert [m.writer for m in await store.manifests()] == [a]
        await store.delete("checkpoint-1")
        assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0

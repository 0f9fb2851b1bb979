"""A throttled store (503 SlowDown on listings, through a real proxy in front of SeaweedFS):
listings are retried, and never read as "no parts" or "no checkpoints"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from tests.integration.s3.conftest import s3_config
from tests.support.checkpoints import one_file
from tests.support.s3proxy import throttling_proxy
from tests.support.seaweed import SeaweedS3

from traind.config import S3Storage
from traind.errors import TransientStorageError
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.layout.parts import Part
from traind.protocol import CheckpointStore

TAG = "checkpoint-7"
W = Writer("a" * 32, "node0")


async def stored(make: Callable[[S3Storage], CheckpointStore], config: S3Storage) -> None:
    """Node 0's and 1's part manifests of TAG (and their files), and a committed
    checkpoint-6."""
    backend = make(config)
    for rank in (0, 1):
        entry = FileEntry(f"__{rank}_0.distcp", 1, "0" * 64)
        await backend.objects.put(f"{TAG}/{entry.path}", b"x")
        await backend.commit_part(Part("run1", TAG, 7, rank, 2, W, (entry,)))
    files = await one_file(backend, "checkpoint-6")
    await backend.commit(Manifest("run1", "checkpoint-6", 6, files, writer=W))


async def test_slow_down_on_listings_is_retried(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore]
) -> None:
    """The first listings answered 503 SlowDown: part_ranks and manifests retry and return
    what is stored."""
    async with asyncio.timeout(60):
        await stored(backends, s3_config(s3_server, bucket))
        async with throttling_proxy(s3_server.endpoint) as proxy:
            backend = backends(s3_config(s3_server, bucket, endpoint_url=proxy.endpoint))
            proxy.throttle = 2
            assert await backend.part_ranks(TAG) == {0, 1}
            proxy.throttle = 2
            assert [m.tag for m in await backend.manifests()] == ["checkpoint-6"]
            proxy.throttle = 2
            assert sorted(p.node_rank for p in await backend.parts(TAG)) == [0, 1]
    assert proxy.throttled == 6


async def test_throttled_for_good_raises_never_empty(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore]
) -> None:
    """Every listing throttled: once retries run out, part_ranks and manifests raise
    TransientStorageError naming SlowDown instead of reporting nothing stored."""
    async with asyncio.timeout(60):
        await stored(backends, s3_config(s3_server, bucket))
        async with throttling_proxy(s3_server.endpoint) as proxy:
            backend = backends(s3_config(s3_server, bucket, endpoint_url=proxy.endpoint,
                                         retries=2))
            proxy.throttle = -1
            with pytest.raises(TransientStorageError, match="SlowDown"):
                await backend.part_ranks(TAG)
            with pytest.raises(TransientStorageError, match="SlowDown"):
                await backend.manifests()
    assert proxy.throttled == 6

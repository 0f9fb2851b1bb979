"""What the resume agreement asks of S3, counted by a real proxy in front of SeaweedFS: node
0 learns every rank's request from one listing, every other host's poll is one GET, and a
throttled listing (503 SlowDown) is retried, never read as "no requests"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from tests.integration.s3.conftest import s3_config
from tests.support.s3proxy import throttling_proxy
from tests.support.seaweed import SeaweedS3

from traind.config import S3Storage
from traind.errors import TransientStorageError
from traind.protocol import CheckpointStore

NODES = 5


def nonce(rank: int, n: int = 0) -> str:
    return f"{rank:x}{n:x}".ljust(32, "0")


async def test_one_listing_per_poll_however_many_ranks(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore]
) -> None:
    """Five ranks' requests: node 0's start_requests is one request (a listing, nonces from
    the key names), another host's read_board one GET, and replacing a request costs a
    listing, one (batch) delete of the older one and one put."""
    async with asyncio.timeout(60):
        direct = backends(s3_config(s3_server, bucket))
        for rank in range(NODES):
            await direct.request_start(rank, nonce(rank))
        await direct.write_board(b"{}")
        async with throttling_proxy(s3_server.endpoint) as proxy:
            node0 = backends(s3_config(s3_server, bucket, endpoint_url=proxy.endpoint))
            assert await node0.start_requests() == {r: nonce(r) for r in range(NODES)}
            assert len(proxy.requests) == 1, proxy.requests
            assert "list-type" in proxy.requests[0]
            proxy.requests.clear()
            assert await node0.read_board() == b"{}"
            assert [r.split()[0] for r in proxy.requests] == ["GET"]
            proxy.requests.clear()
            await node0.request_start(3, nonce(3, 1))
            assert [r.split()[0] for r in proxy.requests] == ["GET", "POST", "PUT"]
            assert "delete" in proxy.requests[1]  # DeleteObjects
            assert await direct.start_requests() == {**{r: nonce(r) for r in range(NODES)},
                                                     3: nonce(3, 1)}


async def test_throttled_requests_listing_is_retried_never_empty(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore]
) -> None:
    """The first listings of the requests answered 503 SlowDown: start_requests retries and
    returns every request; throttled for good it raises naming SlowDown, never {}."""
    async with asyncio.timeout(60):
        direct = backends(s3_config(s3_server, bucket))
        for rank in range(2):
            await direct.request_start(rank, nonce(rank))
        async with throttling_proxy(s3_server.endpoint) as proxy:
            node0 = backends(s3_config(s3_server, bucket, endpoint_url=proxy.endpoint,
                                       retries=2))
            proxy.throttle = 2
            assert await node0.start_requests() == {0: nonce(0), 1: nonce(1)}
            assert proxy.throttled == 2
            proxy.throttle = -1
            with pytest.raises(TransientStorageError, match="SlowDown"):
                await node0.start_requests()


async def test_two_requests_of_one_rank_listed_the_newest_wins(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore]
) -> None:
    """A rank's older request still listed beside its newer one (a delete not yet seen):
    start_requests names the one stored last."""
    async with asyncio.timeout(60):
        node0 = backends(s3_config(s3_server, bucket))
        await node0.request_start(1, nonce(1, 9))
        await asyncio.sleep(1.1)  # listed times are whole seconds
        client = s3_server.client()
        try:
            client.put_object(Bucket=bucket, Key=f"ckpts/run1/.traind-resume/start-1-"
                              f"{nonce(1, 2)}", Body=b"")
        finally:
            client.close()
        assert await node0.start_requests() == {1: nonce(1, 2)}

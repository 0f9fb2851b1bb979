"""The S3 client's per-request pipeline against a real SeaweedFS: botocore handlers that do
nothing for traind's requests are gone from it, and response timestamps are parsed by the
standard library into the datetimes botocore's parser would give."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC
from typing import Any

from botocore.utils import parse_timestamp as botocore_timestamp
from tests.integration.s3.conftest import s3_config
from tests.support.seaweed import SeaweedS3

from traind.storage.s3.client import Ops, open_client, target_of
from traind.storage.s3.errors import RetryPolicy


async def test_requests_carry_no_sdk_retry_headers(s3_server: SeaweedS3, bucket: str) -> None:
    """PUTs and GETs go without botocore's retry headers (``amz-sdk-invocation-id``,
    ``amz-sdk-request``): retries are traind's own, so they could only say attempt 1."""
    config = s3_config(s3_server, bucket)
    headers: list[dict[str, str]] = []

    def record(request: Any, **_: Any) -> None:
        headers.append({k.lower(): v.decode() if isinstance(v, bytes) else str(v)
                        for k, v in request.headers.items()})

    async with contextlib.AsyncExitStack() as stack, asyncio.timeout(60):
        target = target_of(config)
        ops = Ops(await open_client(config, stack, target), target, RetryPolicy(0),
                  config.read_timeout)
        ops.client.meta.events.register("before-send.s3", record)
        key = f"ckpts/{uuid.uuid4().hex}"
        await ops.call("put_object", key, body=memoryview(b"0123456789"))
        resp = await ops.call("get_object", key, Range="bytes=2-5")
        async with resp["Body"] as body:
            assert await body.read() == b"2345"
    assert len(headers) == 2
    for sent in headers:
        assert "amz-sdk-invocation-id" not in sent
        assert "amz-sdk-request" not in sent
        assert "authorization" in sent  # still signed


async def test_timestamps_are_botocores_values_parsed_by_the_standard_library(
    s3_server: SeaweedS3, bucket: str
) -> None:
    """A HEAD's Last-Modified (an HTTP date) and a listing's LastModified (ISO 8601) are
    the UTC datetimes botocore's parser gives, as ``datetime.UTC`` values."""
    config = s3_config(s3_server, bucket)
    async with contextlib.AsyncExitStack() as stack, asyncio.timeout(60):
        target = target_of(config)
        ops = Ops(await open_client(config, stack, target), target, RetryPolicy(0),
                  config.read_timeout)
        key = f"ckpts/{uuid.uuid4().hex}"
        await ops.call("put_object", key, body=memoryview(b"x"))
        head = await ops.call("head_object", key)
        listing = await ops.call("list_objects_v2", Prefix=key)
    raw = head["ResponseMetadata"]["HTTPHeaders"]["last-modified"]
    assert head["LastModified"] == botocore_timestamp(raw)
    assert head["LastModified"].tzinfo is UTC
    (listed,) = listing["Contents"]
    assert listed["LastModified"].tzinfo is UTC
    assert abs((listed["LastModified"] - head["LastModified"]).total_seconds()) < 2

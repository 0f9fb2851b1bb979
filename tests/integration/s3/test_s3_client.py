"""The S3 client's per-request work against a real SeaweedFS: botocore handlers that do
nothing for traind's requests are gone from it, response timestamps are parsed by the
standard library into the datetimes botocore's parser would give, and default parts are
12 MiB (each part costs a request's CPU)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

from botocore.utils import parse_timestamp as botocore_timestamp
from tests.integration.s3.conftest import (
    MIB,
    RecordingSession,
    Sent,
    make_checkpoint,
    opened_ops,
    s3_config,
)
from tests.support.seaweed import SeaweedS3

from traind.config import S3Storage
from traind.storage.s3.store import S3Store


async def test_requests_carry_no_sdk_retry_headers(s3_server: SeaweedS3, bucket: str) -> None:
    """PUTs and GETs go without botocore's retry headers (``amz-sdk-invocation-id``,
    ``amz-sdk-request``): retries are traind's own, so they could only say attempt 1."""
    config = s3_config(s3_server, bucket)
    headers: list[dict[str, str]] = []

    def record(request: Any, **_: Any) -> None:
        headers.append({k.lower(): v.decode() if isinstance(v, bytes) else str(v)
                        for k, v in request.headers.items()})

    async with asyncio.timeout(60), opened_ops(config) as ops:
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
    async with asyncio.timeout(60), opened_ops(config) as ops:
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


async def test_default_parts_are_12_mib(
    s3_server: SeaweedS3, bucket: str, stores: Callable[[S3Storage], S3Store],
    sent: list[Sent], tmp_path: Path,
) -> None:
    """With ``part_size`` left out of the config, a 30 MiB file goes up in three parts
    (12 + 12 + 6 MiB), not S3's customary four of 8 MiB."""
    config = S3Storage.model_validate(s3_config(s3_server, bucket).model_dump(
        exclude={"part_size"}))
    root = tmp_path / "checkpoint-1"
    files = make_checkpoint(root, {"model.safetensors": 30 * MIB})
    session = RecordingSession()
    async with asyncio.timeout(60):
        await stores(config).send("checkpoint-1/", root, files, session)
    parts = [r for r in sent if r.op == "UploadPart"]
    assert len(parts) == 3
    assert sorted(int(r.headers["content-length"]) for r in parts) == [6 * MIB, 12 * MIB,
                                                                       12 * MIB]
    assert session.done["model.safetensors"]

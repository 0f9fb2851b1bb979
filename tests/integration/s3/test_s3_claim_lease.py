"""A claim is a lease on real SeaweedFS: a dead writer's stale claim is taken over with
every object and multipart upload it left, a slow live writer renewing it never is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.integration.s3.conftest import MIB, s3_config
from tests.support.seaweed import SeaweedS3
from tests.support.writers import (
    check_own_bytes,
    close,
    commit_when_stale,
    dead_writer,
    race_for_stale_claim,
    side,
)
from traind.protocol.ownership import ClaimHeldError, ConflictError

from traind.config import S3Storage
from traind.protocol import CheckpointStore

TAG = "checkpoint-1"
PREFIX = f"ckpts/run1/{TAG}/"


async def test_a_dead_writers_claim_is_taken_over_with_all_it_left(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    tmp_path: Path, claim_mode: str,
) -> None:
    """A writer that died mid-upload on S3 (objects and an open multipart upload left):
    once its claim is stale the next writer takes it over and commits its own bytes;
    nothing of the dead one is left under the tag, no multipart upload either."""
    config = s3_config(s3_server, bucket)
    dead = await dead_writer(tmp_path, backends(config))
    client = s3_server.client()
    client.create_multipart_upload(Bucket=bucket, Key=PREFIX + "shard-9.bin")
    fresh = await side(tmp_path, "b", backends(config), steps=1, claim_ttl=4.0)
    try:
        with capture_logs() as logs:
            with pytest.raises(ClaimHeldError):
                await asyncio.wait_for(fresh.streamer.commit(TAG), 30)
            await commit_when_stale(fresh, TAG)
        await check_own_bytes(fresh, backends(config), TAG, tmp_path)
    finally:
        close([dead, fresh])
    assert [e["log_level"] for e in logs if e["event"] == "checkpoint_claim_taken_over"] == [
        "error"]
    keys = {o["Key"][len(PREFIX):] for o in
            client.list_objects_v2(Bucket=bucket, Prefix=PREFIX).get("Contents", [])}
    assert "dead-only.bin" not in keys
    assert not {k for k in keys if k.startswith("traind-claims/") and dead.writer.id in k}
    assert keys <= set(fresh.written[TAG]) | {
        "traind-manifest.json", "traind-writer.json", *{k for k in keys if "takeover" in k},
        *{k for k in keys if k.startswith("traind-claims/")}}
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix=PREFIX).get("Uploads")


async def test_two_takers_of_a_stale_claim_one_wins(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    tmp_path: Path,
) -> None:
    """Two writers (own clients) meeting one stale claim at once on S3: the conditional
    create of the takeover marker lets exactly one through; the other meets its commit."""
    config = s3_config(s3_server, bucket)
    await race_for_stale_claim(tmp_path, lambda: backends(config), TAG)


async def test_a_slow_live_writer_renews_and_is_never_taken_over(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    tmp_path: Path,
) -> None:
    """A writer whose upload (max_bandwidth 1 MiB/s, 6 MiB) outlasts claim_ttl (1 s)
    renews its claim: the other writer waits all along, then meets its commit."""
    slow_config = s3_config(s3_server, bucket, max_bandwidth=MIB)
    slow = await side(tmp_path, "slow", backends(slow_config), steps=1, size=3 * MIB,
                      claim_ttl=1.0)
    other = await side(tmp_path, "other", backends(s3_config(s3_server, bucket)), steps=1,
                       claim_ttl=1.0)
    try:
        with capture_logs() as logs:
            sending = asyncio.Event()
            loop = asyncio.get_running_loop()
            slow.streamer.on_sent = lambda n: loop.call_soon_threadsafe(sending.set)
            committing = asyncio.create_task(slow.streamer.commit(TAG))
            await asyncio.wait_for(sending.wait(), 30)  # claimed, its upload begun
            held: list[float] = []
            while not committing.done():
                await asyncio.sleep(0.2)
                try:
                    await asyncio.wait_for(other.streamer.commit(TAG), 30)
                except ClaimHeldError:
                    held.append(time.monotonic())
                except ConflictError:
                    break
            await asyncio.wait_for(committing, 60)
            with pytest.raises(ConflictError) as lost:
                await asyncio.wait_for(other.streamer.commit(TAG), 30)
        assert held[-1] - held[0] > 1.5  # held well past claim_ttl
        assert lost.value.committed is not None
        await check_own_bytes(slow, backends(slow_config), TAG, tmp_path)
    finally:
        close([slow, other])
    assert not [e for e in logs if e["event"] == "checkpoint_claim_taken_over"]

"""Faults: the S3 server dies mid-upload; the daemon dies mid-upload and resumes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.integration.s3.conftest import (
    MIB,
    Progress,
    RecordingSession,
    make_checkpoint,
    s3_config,
)
from tests.integration.s3.test_s3_store import keys_under, manifest_of
from tests.support.checkpoints import run_in
from tests.support.seaweed import SeaweedS3

from traind.checkpoints.state.journal import Journal, JournalSession
from traind.config import S3Storage
from traind.protocol import CheckpointStore
from traind.storage.s3.store import S3Store

pytestmark = pytest.mark.timeout(90)
Make = Callable[[S3Storage], S3Store]


async def test_server_restart_mid_multipart(
    own_server: SeaweedS3, stores: Make, tmp_path: Path
) -> None:
    """Killing and restarting S3 mid-upload still commits once, and nothing shows before
    (requests cut or refused meanwhile are retried)."""
    own_server.create_bucket("faults")
    root = tmp_path / "checkpoint-3"
    files = make_checkpoint(root, {"shard.bin": 20 * MIB, "config.json": 100})
    store = stores(s3_config(own_server, "faults", concurrency=2, max_bandwidth="8MiB"))
    checkpoints = CheckpointStore(store, "run1")
    session = RecordingSession(threshold=5 * MIB)
    upload = asyncio.create_task(store.send("checkpoint-3/", root, files, session))
    try:
        await asyncio.wait_for(session.progress.reached.wait(), 20)
        await asyncio.wait_for(asyncio.to_thread(own_server.stop), 15)
        await asyncio.sleep(0.3)
        await asyncio.wait_for(asyncio.to_thread(own_server.start), 30)
        assert "ckpts/run1/checkpoint-3/traind-manifest.json" not in keys_under(
            own_server, "faults", "ckpts/"
        )
        await asyncio.wait_for(upload, 40)
    finally:
        upload.cancel()
    async with asyncio.timeout(20):
        assert await checkpoints.manifests() == []
        manifest = manifest_of("checkpoint-3", root, session.done)
        await checkpoints.commit(manifest)
        assert await checkpoints.manifests() == [manifest]
        unthrottled = stores(s3_config(own_server, "faults"))
        got = await unthrottled.fetch("checkpoint-3/", files, tmp_path / "out", lambda n: None)
    assert got == session.done
    assert got["shard.bin"] == hashlib.sha256((root / "shard.bin").read_bytes()).hexdigest()
    client = own_server.client()
    assert client.list_multipart_uploads(Bucket="faults").get("Uploads", []) == []
    client.close()
    assert keys_under(own_server, "faults", "ckpts/run1/checkpoint-3/") == [
        "ckpts/run1/checkpoint-3/config.json", "ckpts/run1/checkpoint-3/shard.bin",
        "ckpts/run1/checkpoint-3/traind-manifest.json",
    ]


async def test_resume_skips_finished_parts(
    s3_server: SeaweedS3, bucket: str, stores: Make, tmp_path: Path
) -> None:
    """A daemon that died mid-upload resumes from the journal and re-sends no finished part."""
    tag, size = "checkpoint-9", 20 * MIB + 17
    root = tmp_path / tag
    files = make_checkpoint(root, {"shard.bin": size})
    journal = Journal(tmp_path / "state" / "journal.db", run_in(tmp_path))
    try:
        await journal.staged(tag, 9, root, files)
        config = s3_config(s3_server, bucket, concurrency=1, max_bandwidth="10MiB")
        first = Progress(threshold=10 * MIB)
        upload = asyncio.create_task(
            stores(config).send(f"{tag}/", root, files, JournalSession(journal, tag, first))
        )
        await asyncio.wait_for(first.reached.wait(), 20)
        upload.cancel()  # the daemon dies here
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(upload, 10)

        saved = json.loads(await journal.load_resume(tag, "shard.bin") or "{}")
        finished = {n: 5 * MIB for n, _etag, _crc in saved["parts"]}
        assert len(finished) >= 2
        client = s3_server.client()
        try:
            listed = client.list_parts(Bucket=bucket, Key="ckpts/run1/checkpoint-9/shard.bin",
                                       UploadId=saved["upload_id"])["Parts"]
        finally:
            client.close()
        assert {p["PartNumber"] for p in listed} >= finished.keys()

        second = Progress()
        async with asyncio.timeout(30):
            await stores(config).send(f"{tag}/", root, files,
                                      JournalSession(journal, tag, second))
        # Parts the journal recorded are not sent again (one in flight at the kill may be).
        assert 0 < second.total <= size - sum(finished.values())
        stored = await journal.files(tag)
        assert stored[0].sha256 == hashlib.sha256((root / "shard.bin").read_bytes()).hexdigest()
        assert await journal.resume_states(tag) == []
    finally:
        journal.close()


class DiesOnFileDone(RecordingSession):
    """A session whose daemon dies after the object is complete but before it is recorded."""

    async def file_done(self, path: str, sha256: str) -> None:
        raise RuntimeError("daemon died")


async def test_resume_after_complete_sends_nothing(
    s3_server: SeaweedS3, bucket: str, stores: Make, tmp_path: Path
) -> None:
    """An upload completed but not recorded is recognised by its ETag and not sent again."""
    root = tmp_path / "checkpoint-2"
    files = make_checkpoint(root, {"shard.bin": 11 * MIB})
    config = s3_config(s3_server, bucket)
    dying = DiesOnFileDone()
    with pytest.raises(RuntimeError, match="daemon died"):
        async with asyncio.timeout(20):
            await stores(config).send("checkpoint-2/", root, files, dying)
    again = RecordingSession()
    again.states = dict(dying.states)
    async with asyncio.timeout(20):
        await stores(config).send("checkpoint-2/", root, files, again)
    assert again.advanced == 0
    assert again.done == {
        "shard.bin": hashlib.sha256((root / "shard.bin").read_bytes()).hexdigest()
    }

"""The obstore S3 store's multipart upload and multi-range restore, against a real
SeaweedFS: a file larger than a part goes up as one multipart object, its sha256 computed
as it is read, and comes back through ranges hashed in order."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from tests.integration.s3.conftest import MIB, RecordingSession, make_checkpoint, s3_config
from tests.support.seaweed import SeaweedS3

from traind.storage.s3.obstore_store import ObstoreS3Store


async def test_multipart_up_and_ranges_back(s3_server: SeaweedS3, bucket: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3-part file and a small one are sent (one multipart object of three parts, every
    byte counted once) and fetched in 1 MiB ranges, three at a time, with their sha256s."""
    monkeypatch.setattr("traind.storage.s3.obstore_store.RANGE_SIZE", MIB)
    store = ObstoreS3Store(s3_config(s3_server, bucket, client="obstore", concurrency=3),
                           "run1")
    root = tmp_path / "src"
    files = make_checkpoint(root, {"shard.bin": 10 * MIB + 17, "config.json": 300})
    want = {f.path: hashlib.sha256((root / f.path).read_bytes()).hexdigest() for f in files}
    session = RecordingSession()
    async with asyncio.timeout(120):
        await store.send("checkpoint-1/", root, files, session)
        whole = await store.get("checkpoint-1/shard.bin")
        back = await store.fetch("checkpoint-1/", files, tmp_path / "back", lambda n: None)
    assert session.done == want
    assert back == want
    assert session.advanced == 10 * MIB + 17 + 300
    assert whole is not None
    assert whole.version.strip('"').endswith("-3")
    for f in files:
        assert (tmp_path / "back" / f.path).read_bytes() == (root / f.path).read_bytes()

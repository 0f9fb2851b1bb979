"""Hugging Face Storage Buckets through their S3 gateway, with the S3 store and the
documented configuration (region us-east-1, path addressing, checksums when_required): a
checkpoint is stored, listed, restored and pruned behind a stand-in enforcing the gateway's
rules (tests/support/buckets_gateway.py)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from pathlib import Path

import aiohttp
from tests.conformance.conftest import s3_config
from tests.conformance.test_primitives import _write
from tests.support.buckets_gateway import buckets_gateway
from tests.support.seaweed import SeaweedS3
from tests.support.sessions import RecordingSession as Session

from traind.checkpoints.restore.download import restore
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore
from traind.storage import open_objects

BUCKETS = {"region": "us-east-1", "addressing_style": "path",
           "request_checksum_calculation": "when_required", "retries": 1}
"""The configuration README.md documents for Storage Buckets (beside endpoint_url)."""


async def test_a_checkpoint_through_the_buckets_gateway(s3_server: SeaweedS3,
                                                         tmp_path: Path) -> None:
    """Stored (one file multipart), listed, restored byte for byte and pruned through the
    gateway; no request needed a rule it refuses; a GET from another client than botocore
    is redirected, as the gateway does."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    files = {"model.safetensors": os.urandom(11 * 1024 * 1024), "trainer_state.json": b"{}"}
    writer = Writer("c" * 32, "host-c")
    async with buckets_gateway(s3_server.endpoint) as gateway:
        store = CheckpointStore(open_objects(
            s3_config(gateway.endpoint, bucket, part_size="5MiB", **BUCKETS), "run"), "run")
        try:
            async with asyncio.timeout(60):
                local = _write(tmp_path / "src", files)
                session = Session()
                await store.claim("checkpoint-3", writer)
                await store.upload("checkpoint-3", tmp_path / "src", local, session)
                entries = tuple(FileEntry(f.path, f.size, session.done[f.path]) for f in local)
                await store.commit(Manifest("run", "checkpoint-3", 3, entries, writer=writer))
                listed = [m.tag for m in await store.manifests()]
                dest = await restore(store, (await store.manifests())[0], tmp_path / "back")
                async with aiohttp.ClientSession() as http, http.get(
                        f"{gateway.endpoint}/{bucket}/ckpts/run/checkpoint-3/trainer_state.json",
                        allow_redirects=False) as plain:
                    redirected = plain.status
                await store.delete("checkpoint-3")
                left = await store.objects.list("")
        finally:
            await store.aclose()
    assert listed == ["checkpoint-3"]
    assert {p: (dest / p).read_bytes() for p in files} == files
    assert session.done["model.safetensors"] == hashlib.sha256(
        files["model.safetensors"]).hexdigest()
    assert left == []
    assert redirected == 302
    assert "trailer" not in gateway.refused
    assert "metadata" not in gateway.refused  # traind keeps nothing in x-amz-meta-*
    assert "upload-part-copy" not in gateway.refused

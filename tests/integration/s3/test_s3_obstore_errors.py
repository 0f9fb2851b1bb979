"""The obstore S3 store's failures carry the facts the aiobotocore store's do (S3 code, HTTP
status, key, operation, transient or not) and say what to fix without a secret, read from
obstore's real errors against a real SeaweedFS."""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.integration.s3.conftest import s3_config
from tests.support.net import free_port
from tests.support.seaweed import SECRET_KEY, SeaweedS3

from traind.errors import StorageError, TransientStorageError
from traind.storage.s3.obstore_store import ObstoreS3Store


async def test_answers_carry_code_status_and_key(s3_server: SeaweedS3, bucket: str) -> None:
    """A missing object is NoSuchKey/404 and ``missing``; a wrong secret and a missing
    bucket are permanent and name what to fix; no message holds the secret."""
    store = ObstoreS3Store(s3_config(s3_server, bucket, client="obstore"), "run1")
    wrong = ObstoreS3Store(s3_config(s3_server, bucket, client="obstore",
                                     secret_access_key="not-the-secret"), "run1")
    gone = ObstoreS3Store(s3_config(s3_server, "no-such-bucket", client="obstore"), "run1")
    async with asyncio.timeout(60):
        with pytest.raises(StorageError) as missing:
            await store.get_range("t/absent", 0, 10)
        with pytest.raises(StorageError) as denied:
            await wrong.put("t/x", b"1")
        with pytest.raises(StorageError) as nobucket:
            await gone.probe()
    e = missing.value
    assert (e.code, e.status, e.key, e.op) == ("NoSuchKey", 404, "ckpts/run1/t/absent",
                                               "get_object")
    assert (e.missing, e.transient) == (True, False)
    assert (denied.value.code, denied.value.status, denied.value.transient) == (
        "SignatureDoesNotMatch", 403, False)
    assert "secret access key does not match" in str(denied.value)
    assert "bucket 'no-such-bucket' does not exist" in str(nobucket.value)
    for err in (missing.value, denied.value, nobucket.value):
        assert SECRET_KEY not in str(err)
        assert "not-the-secret" not in str(err)


async def test_exhausted_retries_are_transient(own_server: SeaweedS3) -> None:
    """An endpoint that answered once and then went away fails, after its retries, as
    transient."""
    own_server.create_bucket("facts")
    store = ObstoreS3Store(s3_config(own_server, "facts", client="obstore", retries=1,
                                     retry_max_delay=0.1), "run1")
    async with asyncio.timeout(60):
        await store.list("")  # reached
        own_server.stop()
        with pytest.raises(TransientStorageError, match="gave up after 2 attempts") as caught:
            await store.get("k")
    assert (caught.value.key, caught.value.op) == ("ckpts/run1/k", "get_object")


async def test_an_endpoint_never_reached_is_reported_at_once(s3_server: SeaweedS3) -> None:
    """Nothing listening at the endpoint: a transient error naming it, not retried."""
    config = s3_config(s3_server, "facts", client="obstore",
                       endpoint_url=f"http://127.0.0.1:{free_port()}")
    store = ObstoreS3Store(config, "run1")
    started = time.monotonic()
    async with asyncio.timeout(30):
        with pytest.raises(TransientStorageError, match="cannot reach the S3 endpoint"):
            await store.get("k")
    assert time.monotonic() - started < 1.0

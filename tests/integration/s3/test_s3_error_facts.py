"""S3 store errors carry their facts (S3 code, HTTP status, key, operation, transient or
not), set where botocore's errors are translated, against a real SeaweedFS."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from tests.integration.s3.conftest import opened_ops, s3_config
from tests.support.seaweed import SeaweedS3

from traind.errors import StorageError, TransientStorageError
from traind.storage.s3.client import put_object
from traind.storage.s3.target import RetryPolicy


async def test_store_errors_carry_code_status_and_key(s3_server: SeaweedS3, bucket: str) -> None:
    """NoSuchKey, NoSuchUpload and a failed precondition (412) reach callers as facts on
    the StorageError: ``code``, ``status``, ``key``, ``op``, ``missing``, not transient."""
    config = s3_config(s3_server, bucket)
    async with asyncio.timeout(60), opened_ops(config) as ops:
        key = f"ckpts/{uuid.uuid4().hex}"

        with pytest.raises(StorageError) as nokey:
            await ops.call("get_object", key)
        e = nokey.value
        assert (e.code, e.status, e.key, e.op) == ("NoSuchKey", 404, key, "get_object")
        assert (e.missing, e.transient) == (True, False)
        assert not isinstance(e, TransientStorageError)

        with pytest.raises(StorageError) as noupload:
            await ops.call("list_parts", key, UploadId="no-such-upload")
        e = noupload.value
        assert (e.code, e.status, e.key, e.missing) == ("NoSuchUpload", 404, key, True)

        assert await put_object(ops, key, b"1", IfNoneMatch="*")
        with pytest.raises(StorageError) as taken:
            await ops.call("put_object", key, body=memoryview(b"2"), IfNoneMatch="*")
        e = taken.value
        assert (e.code, e.status, e.missing, e.transient) == (
            "PreconditionFailed", 412, False, False)
        await ops.call("delete_object", key)


async def test_exhausted_retries_are_transient(own_server: SeaweedS3) -> None:
    """An endpoint that answered once and then went away fails, after its retries, as
    transient: the fact every retry loop above decides by."""
    own_server.create_bucket("facts")
    config = s3_config(own_server, "facts")
    policy = RetryPolicy(1, base=0.05, cap=0.1)
    async with asyncio.timeout(60), opened_ops(config, policy) as ops:
        await ops.call("list_objects_v2", MaxKeys=1)  # reached
        own_server.stop()
        with pytest.raises(TransientStorageError, match="gave up after 2 attempts") as caught:
            await ops.call("get_object", "k")
    assert caught.value.transient
    assert (caught.value.key, caught.value.op) == ("k", "get_object")

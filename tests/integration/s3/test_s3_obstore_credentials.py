"""The obstore S3 store finds the credentials and region of an AWS profile (through
botocore's session: obstore reads no profile), against a real SeaweedFS."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.integration.s3.conftest import s3_config
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3

from traind.storage.s3.obstore_store import ObstoreS3Store


async def test_a_profile_signs_the_requests(s3_server: SeaweedS3, bucket: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``profile`` and no keys in the config, the profile's keys and region sign every
    request: an object is written and read back."""
    (tmp_path / "credentials").write_text(
        f"[ckpt]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    (tmp_path / "config").write_text(f"[profile ckpt]\nregion = {REGION}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    config = s3_config(s3_server, bucket, client="obstore", profile="ckpt",
                       access_key_id=None, secret_access_key=None, region=None)
    store = ObstoreS3Store(config, "run1")
    async with asyncio.timeout(30):
        assert await store.put("t/blob", b"signed by the profile")
        got = await store.get("t/blob")
    assert got is not None
    assert got.data == b"signed by the profile"

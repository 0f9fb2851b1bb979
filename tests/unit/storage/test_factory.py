"""The S3 client is chosen by one key, and each store's libraries load only when it is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from traind.config import S3Storage
from traind.storage import open_objects
from traind.storage.s3.obstore_store import ObstoreS3Store
from traind.storage.s3.store import S3Store

PROBE = """
import sys
from traind.config import S3Storage
from traind.storage import open_objects
open_objects(S3Storage(type="s3", bucket="b", client={client!r}), "run")
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"aiobotocore", "aiohttp", "obstore"}}))
"""


@pytest.mark.parametrize(("client", "cls"), [("aiobotocore", S3Store),
                                             ("obstore", ObstoreS3Store)])
def test_client_key_picks_the_store(client: str, cls: type) -> None:
    """``[storage] client`` picks the S3 store class; aiobotocore when unset."""
    config = S3Storage(type="s3", bucket="b", client=client)
    assert type(open_objects(config, "run")) is cls
    assert S3Storage(type="s3", bucket="b").client == "aiobotocore"


@pytest.mark.parametrize(("client", "loaded"), [("aiobotocore", ["aiobotocore", "aiohttp"]),
                                                ("obstore", ["obstore"])])
def test_each_client_imports_only_its_library(client: str, loaded: list[str]) -> None:
    """Opening the obstore store imports neither aiobotocore nor aiohttp (their start-up
    CPU is a share of a short command's), and the aiobotocore store no obstore."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(client=client)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == repr(loaded)

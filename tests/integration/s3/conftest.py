"""Fixtures for the S3 store tests: one real SeaweedFS per session, a fresh bucket per test;
``stores`` makes the S3 store itself, ``backends`` the checkpoint protocol over it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support import sessions
from tests.support.requires import need_binary
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, running_seaweed

from traind.config import S3Storage
from traind.protocol import CheckpointStore, open_storage
from traind.storage import LocalFile
from traind.storage.s3 import store as s3
from traind.storage.s3.client import Ops, open_client
from traind.storage.s3.store import S3Store
from traind.storage.s3.target import RetryPolicy, target_of

MIB = 1024 * 1024


@pytest.fixture(scope="session")
def weed() -> str:
    """The ``weed`` executable (skip, or fail under CI, when missing)."""
    return need_binary("weed")


@pytest.fixture(scope="session")
def s3_server(weed: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS shared by the tests that do not stop it."""
    with running_seaweed(weed, tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def own_server(weed: str, tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS for one test, which may kill and restart it."""
    with running_seaweed(weed, tmp_path / "seaweed") as server:
        yield server


def s3_config(server: SeaweedS3, bucket: str, **overrides: Any) -> S3Storage:
    """A config pointing at ``server``; small parts so multipart paths run on small files."""
    values: dict[str, Any] = {
        "type": "s3", "bucket": bucket, "prefix": "ckpts", "endpoint_url": server.endpoint,
        "region": REGION, "addressing_style": "path", "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY, "part_size": 5 * MIB, "concurrency": 4,
        "retries": 6, "retry_max_delay": 2.0, "connect_timeout": 2.0, "read_timeout": 10.0,
    }
    return S3Storage(**(values | overrides))


@contextlib.asynccontextmanager
async def opened_ops(config: S3Storage, policy: RetryPolicy | None = None) -> AsyncIterator[Ops]:
    """``Ops`` on a client opened from ``config`` (closed on leaving), retrying as
    ``policy`` says (by default not at all)."""
    async with contextlib.AsyncExitStack() as stack:
        target = target_of(config)
        client = await open_client(config, stack, target)
        yield Ops(client, target, policy or RetryPolicy(0), config.read_timeout)


@pytest.fixture
def bucket(s3_server: SeaweedS3) -> str:
    """A fresh, empty bucket on the shared server."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
async def stores() -> AsyncIterator[Callable[..., S3Store]]:
    """Make S3 stores for run ``run1`` (or ``run``); all are closed after the test."""
    made: list[S3Store] = []

    def make(config: S3Storage, run: str = "run1") -> S3Store:
        made.append(S3Store(config, run))
        return made[-1]

    yield make
    for store in made:
        await store.aclose()


@pytest.fixture
async def backends() -> AsyncIterator[Callable[..., CheckpointStore]]:
    """Make checkpoint stores (the protocol over an S3 store) for run ``run1`` (or
    ``run``); all are closed after the test."""
    made: list[CheckpointStore] = []

    def make(config: S3Storage, run: str = "run1") -> CheckpointStore:
        made.append(open_storage(config, run))
        return made[-1]

    yield make
    for backend in made:
        await backend.aclose()


def make_checkpoint(root: Path, sizes: dict[str, int], seed: int = 0) -> list[LocalFile]:
    """Write files of incompressible bytes under ``root``; return them as LocalFiles."""
    rng = random.Random(seed)
    files = []
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        files.append(LocalFile(rel, size))
    return files


class Progress:
    """An ``advance`` callback that counts bytes and sets ``reached`` past a threshold."""

    def __init__(self, threshold: int = 0) -> None:
        self.total = 0
        self.threshold = threshold
        self.reached = asyncio.Event()

    def __call__(self, nbytes: int) -> None:
        self.total += nbytes
        if self.threshold and self.total >= self.threshold:
            self.reached.set()


class RecordingSession(sessions.RecordingSession):
    """The in-memory UploadSession, its progress also counted by a ``Progress``."""

    def __init__(self, threshold: int = 0) -> None:
        super().__init__()
        self.progress = Progress(threshold)

    @property
    def advanced(self) -> int:
        """Bytes reported as sent."""
        return self.progress.total

    def advance(self, nbytes: int) -> None:
        super().advance(nbytes)
        self.progress(nbytes)


@dataclass
class Sent:
    """One request as the client sent it: operation, URL, headers, and the body's type."""

    op: str
    url: str
    headers: dict[str, str]
    body: type


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    """Every request the stores' S3 clients send (botocore's ``before-send`` event), in
    order."""
    seen: list[Sent] = []
    original = s3.open_client

    def record(request: Any, event_name: str, **_: Any) -> None:
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else str(v)
                   for k, v in request.headers.items()}
        seen.append(Sent(event_name.rpartition(".")[2], str(request.url), headers,
                         type(request.body)))

    async def spy(*args: Any) -> Any:
        client = await original(*args)
        client.meta.events.register("before-send.s3", record)
        return client

    monkeypatch.setattr(s3, "open_client", spy)
    return seen


@pytest.fixture(params=["conditional", "listed"])
def claim_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the store claims tags: If-None-Match, or (TRAIND_S3_CONDITIONAL=0) listing."""
    monkeypatch.delenv("TRAIND_S3_CONDITIONAL", raising=False)
    if request.param == "listed":
        monkeypatch.setenv("TRAIND_S3_CONDITIONAL", "0")
    return str(request.param)

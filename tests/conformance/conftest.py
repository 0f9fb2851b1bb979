"""The stores every conformance test runs against, each with a real server where it has one:
memory (also as a store without atomic conditional puts, and as one that stages what it is
sent as the Hub does), a local directory, SeaweedFS over S3 through each client, aiobotocore
and obstore (with conditional writes, and behind a proxy that drops them, so the listing
fallback decides), OpenSSH's sshd in each transfer mode, and the Hugging Face Hub stand-in
(``tests/support/fake_hub.py``) with the real ``huggingface_hub`` as its client. A new store
is done when every test here passes on it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_hub import TOKEN, FakeHub, running_hub
from tests.support.requires import need_binary, need_module
from tests.support.s3proxy import throttling_proxy
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, running_seaweed
from tests.support.sshd import HOST, SSHServer

from traind.config import HFStorage, LocalStorage, S3Storage, SSHStorage
from traind.protocol import CheckpointStore
from traind.storage import LocalFile, ObjectStore, UploadSession, open_objects
from traind.storage.base import StagingStore
from traind.storage.memory import MemoryStore

KINDS = ["memory", "memory-listed", "memory-staged", "local", "s3", "s3-listed", "s3-obstore",
         "s3-obstore-listed", "ssh", "ssh-openssh", "ssh-rsync", "hf"]
STAGED = {"memory-staged", "hf"}
"""Stores whose send stages files until one change publishes them with the manifest: they
hold no claim objects (the commit decides whose a tag is): the lease tests run on the others
(``@claiming``), and the same guarantees have tests of their own on these (``@staging``)."""
CLAIMING = [k for k in KINDS if k not in STAGED]
claiming = pytest.mark.parametrize("stores", CLAIMING, indirect=True)
"""A test of claim objects (leases, take-over): on every store that keeps them."""
staging = pytest.mark.parametrize("stores", sorted(STAGED), indirect=True)
"""A test of what a store that stages its files guarantees instead."""
ON_DISK = ["local", "ssh", "ssh-openssh", "ssh-rsync"]
"""Stores backed by a directory tree, where links, FIFOs and directories can stand where a
file or a directory of traind's belongs."""
on_disk = pytest.mark.parametrize("stores", ON_DISK, indirect=True)
"""A test of what a store backed by a directory does with what is planted in it
(``Stores.directory``)."""
RUN = "run"


@dataclass
class Stores:
    """Handles on one fresh store, as several hosts would open it (``make`` again for
    another host); ``kind`` names it."""

    kind: str
    build: Callable[[], ObjectStore]
    made: list[ObjectStore] = field(default_factory=list)
    disk: Path | None = None
    """The run's directory behind the store (``ON_DISK`` kinds), None for the others."""

    @property
    def directory(self) -> Path:
        """The run's directory behind the store, to plant things in (``@on_disk`` tests)."""
        assert self.disk is not None, f"{self.kind} has no directory behind it"
        return self.disk

    @property
    def staged(self) -> bool:
        """Whether sent files are visible only once published with a manifest."""
        return self.kind in STAGED

    def make(self) -> ObjectStore:
        """Another handle on the same store (another host's)."""
        store = self.build()
        self.made.append(store)
        return store

    def checkpoints(self) -> CheckpointStore:
        """The checkpoint protocol over another handle (another host's daemon)."""
        return CheckpointStore(self.make(), RUN)

    async def sent(self, store: ObjectStore, prefix: str, root: Path,
                   files: Sequence[LocalFile], session: UploadSession) -> None:
        """``send``, then on a store that stages it, ``publish`` the files alone."""
        await store.send(prefix, root, files, session)
        if self.staged:
            assert isinstance(store, StagingStore)
            assert await store.publish(prefix, files, "test: the files alone")

    async def names(self, tag: str) -> list[str]:
        """Every object's name under ``<tag>/`` (claims included), sorted."""
        base = f"{tag}/"
        return sorted(m.key[len(base):] for m in await self.make().list(base))


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS for every S3 case here."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """One sshd for every SSH case here."""
    need_module("asyncssh")
    server = SSHServer(need_binary("sshd"), tmp_path_factory.mktemp("sshd"))
    server.start_sync()
    try:
        yield server
    finally:
        server.stop_sync()


@pytest.fixture(scope="session")
def hub() -> Iterator[FakeHub]:
    """One Hub stand-in for every Hub case here (a fresh repo each)."""
    need_module("huggingface_hub")
    with running_hub() as server:
        yield server


def hf_config(hub: FakeHub, repo_id: str, **overrides: Any) -> HFStorage:
    """A config for ``repo_id`` on the stand-in ``hub`` (created on first use)."""
    return HFStorage.model_validate({
        "type": "hf", "repo_id": repo_id, "endpoint": hub.endpoint, "token": TOKEN,
        "path_in_repo": "ckpts", "create_repo": True, **overrides})


def s3_config(endpoint: str, bucket: str, **overrides: Any) -> S3Storage:
    """A config for ``bucket`` at ``endpoint`` (fast retries, for tests)."""
    return S3Storage.model_validate({
        "type": "s3", "bucket": bucket, "prefix": "ckpts", "endpoint_url": endpoint,
        "region": REGION, "addressing_style": "path", "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY, "retries": 4, "retry_max_delay": 0.5,
        "connect_timeout": 2.0, "read_timeout": 10.0, **overrides})


def ssh_config(sshd: SSHServer, remote: Path, transfer: str) -> SSHStorage:
    """A config for ``remote`` on ``sshd`` with ``transfer`` (fast retries, for tests)."""
    return SSHStorage.model_validate({
        "type": "ssh", "host": HOST, "port": sshd.port, "user": sshd.user,
        "identity_file": sshd.user_key.path, "known_hosts": sshd.known_hosts,
        "remote_path": str(remote), "connect_timeout": 5, "retries": 3,
        "backoff_initial": 0.05, "backoff_max": 0.5, "transfer": transfer})


@pytest.fixture(params=KINDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stores]:
    """A fresh store of the parameter's kind; every handle made on it is closed after."""
    async with _opened(str(request.param), request, tmp_path, monkeypatch) as made:
        yield made


@contextlib.asynccontextmanager
async def _opened(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stores]:
    stack = contextlib.AsyncExitStack()
    build: Callable[[], ObjectStore]
    disk = None
    if kind == "memory-staged":  # as the Hub: each host's handle stages what it sends
        build = MemoryStore(staged=True).handle
    elif kind.startswith("memory"):
        shared = MemoryStore(conditional=kind == "memory")
        build = lambda: shared  # noqa: E731 - every host sees the one dict
    elif kind == "local":
        config_l = LocalStorage(path=tmp_path / "store")
        build = lambda: open_objects(config_l, RUN)  # noqa: E731
        disk = tmp_path / "store" / RUN
    elif kind.startswith("s3"):
        server: SeaweedS3 = request.getfixturevalue("seaweed")
        monkeypatch.delenv("TRAIND_S3_CONDITIONAL", raising=False)
        bucket = f"t-{uuid.uuid4().hex[:12]}"
        server.create_bucket(bucket)
        endpoint = server.endpoint
        if kind.endswith("-listed"):  # a store that ignores If-None-Match / If-Match: found so
            proxy = await stack.enter_async_context(
                throttling_proxy(endpoint, ignore_conditions=True))
            endpoint = proxy.endpoint
        client = "obstore" if kind.startswith("s3-obstore") else "aiobotocore"
        config_s = s3_config(endpoint, bucket, client=client)
        build = lambda: open_objects(config_s, RUN)  # noqa: E731
    elif kind == "hf":
        hub_: FakeHub = request.getfixturevalue("hub")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # the stand-in serves LFS, not Xet
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_XET", True)
        config_f = hf_config(hub_, f"traind/t-{uuid.uuid4().hex[:12]}")
        build = lambda: open_objects(config_f, RUN)  # noqa: E731
    else:
        sshd_: SSHServer = request.getfixturevalue("sshd")
        transfer = kind.removeprefix("ssh").removeprefix("-") or "sftp"
        for tool in {"openssh": ["ssh"], "rsync": ["rsync", "ssh"]}.get(transfer, []):
            need_binary(tool)
        config_h = ssh_config(sshd_, tmp_path / "remote", transfer)
        build = lambda: open_objects(config_h, RUN)  # noqa: E731
        disk = tmp_path / "remote" / RUN  # sshd runs here, as this user
    made = Stores(kind, build, disk=disk)
    try:
        yield made
    finally:
        async with asyncio.timeout(20):
            for store in {id(s): s for s in made.made}.values():
                await store.aclose()
            await stack.aclose()

"""Restores against a real SeaweedFS: bytes and hashes, one ranged GET per range, connection
reuse, resets and stalls mid-body, errors."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.integration.s3.conftest import MIB, RecordingSession, Sent, make_checkpoint, s3_config
from tests.integration.s3.test_s3_store import files_of, manifest_of
from tests.support.net import serving
from tests.support.seaweed import SeaweedS3

from traind.config import S3Storage
from traind.errors import IntegrityError, StorageError, TransientStorageError
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.storage.s3.store import S3Store

pytestmark = pytest.mark.timeout(60)
Make = Callable[[S3Storage], S3Store]
SIZES = {"model.safetensors": 12 * MIB + 77, "config.json": 1000, "empty.txt": 0}
RANGES = 13 + 1  # 1 MiB ranges of the large file, and the small one
W = Writer("a" * 32, "h")


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restore in 1 MiB ranges, so a small file takes many GETs."""
    monkeypatch.setattr("traind.storage.s3.store.RANGE_SIZE", MIB)


async def uploaded(
    server: SeaweedS3, bucket: str, stores: Make, root: Path, sizes: dict[str, int]
) -> Manifest:
    """Upload files of ``sizes`` under ``root`` as checkpoint-1; return its manifest."""
    files = make_checkpoint(root, sizes, seed=7)
    session = RecordingSession()
    store = stores(s3_config(server, bucket))
    async with asyncio.timeout(30):
        await store.send("checkpoint-1/", root, files, session)
    return manifest_of("checkpoint-1", root, session.done)


def check_restored(root: Path, out: Path, got: dict[str, str], manifest: Manifest) -> None:
    assert got == {f.path: f.sha256 for f in manifest.files}
    for f in manifest.files:
        data = (root / f.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f.sha256
        assert (out / f.path).read_bytes() == data


class Relay:
    """A TCP relay to the S3 server that can cut (RST) or stall its first response stream
    after ``after`` bytes; counts connections."""

    def __init__(self, upstream: str, mode: str = "", after: int = 0) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self._upstream = (host, int(port))
        self.mode, self.after = mode, after
        self.connections = 0
        self.faults = 0
        self.endpoint = ""
        self._tasks: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        async with serving(self._serve) as self.endpoint:
            try:
                yield self
            finally:
                for task in self._tasks:
                    task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        down = asyncio.create_task(self._pipe(up_reader, writer, faulty=True))
        self._tasks.add(down)
        try:
            await self._pipe(reader, up_writer, faulty=False)
        finally:
            up_writer.close()

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, faulty: bool
    ) -> None:
        sent = 0
        with contextlib.suppress(ConnectionError):
            while data := await src.read(64 * 1024):
                if faulty and self.mode and not self.faults and sent + len(data) > self.after:
                    self.faults += 1
                    dst.write(data[: self.after - sent])
                    if self.mode == "stall":
                        await asyncio.sleep(3600)
                    dst.transport.abort()
                    return
                sent += len(data)
                dst.write(data)
                await dst.drain()
            dst.close()


async def test_restore_round_trip(
    s3_server: SeaweedS3, bucket: str, stores: Make, tmp_path: Path, sent: list[Sent],
) -> None:
    """Every byte arrives and is hashed, one ranged GET per range; connections are kept
    alive and reused."""
    root = tmp_path / "checkpoint-1"
    manifest = await uploaded(s3_server, bucket, stores, root, SIZES)
    async with Relay(s3_server.endpoint).running() as relay:
        store = stores(s3_config(s3_server, bucket, endpoint_url=relay.endpoint,
                                 concurrency=2))
        progress: list[int] = []
        async with asyncio.timeout(30):
            got = await store.fetch("checkpoint-1/", files_of(manifest), tmp_path / "out",
                                    progress.append)
            check_restored(root, tmp_path / "out", got, manifest)
            again = await store.fetch("checkpoint-1/", files_of(manifest), tmp_path / "again",
                                      lambda n: None)
            check_restored(root, tmp_path / "again", again, manifest)
    assert sum(progress) == manifest.total_bytes
    gets = [r.headers.get("range") for r in sent if r.op == "GetObject"]
    assert len(gets) == 2 * RANGES
    assert None not in gets
    assert relay.connections <= 2  # the client's pool (concurrency=2), across both restores


@pytest.mark.parametrize("mode", ["reset", "stall"])
async def test_restore_survives_a_broken_stream(
    s3_server: SeaweedS3, bucket: str, stores: Make, tmp_path: Path,
    mode: str,
) -> None:
    """A connection reset or stalled mid-body is retried, and the range resumes."""
    root = tmp_path / "checkpoint-1"
    manifest = await uploaded(s3_server, bucket, stores, root, SIZES)
    async with Relay(s3_server.endpoint, mode, after=3 * MIB).running() as relay:
        store = stores(s3_config(s3_server, bucket, endpoint_url=relay.endpoint,
                                 read_timeout=1.0))
        async with asyncio.timeout(30):
            got = await store.fetch("checkpoint-1/", files_of(manifest), tmp_path / "out",
                                    lambda n: None)
    assert relay.faults == 1
    check_restored(root, tmp_path / "out", got, manifest)


async def test_restore_errors_are_translated(
    s3_server: SeaweedS3, bucket: str, stores: Make, tmp_path: Path,
) -> None:
    """A missing object fails at once with S3's reason; an object that is not the size the
    manifest says fails as an integrity error."""
    root = tmp_path / "checkpoint-1"
    manifest = await uploaded(s3_server, bucket, stores, root, {"a.bin": 6 * MIB})
    store = stores(s3_config(s3_server, bucket))
    (entry,) = manifest.files
    missing = Manifest(run="run1", tag="checkpoint-1", step=1,
                       files=(FileEntry("nope.bin", 10, entry.sha256),), writer=W)
    async with asyncio.timeout(20):
        with pytest.raises(StorageError, match="NoSuchKey") as caught:
            await store.fetch("checkpoint-1/", files_of(missing), tmp_path / "out",
                              lambda n: None)
        assert not isinstance(caught.value, TransientStorageError)
        for size in (entry.size + 1, entry.size - 1):
            wrong = Manifest(run="run1", tag="checkpoint-1", step=1,
                             files=(FileEntry("a.bin", size, entry.sha256),), writer=W)
            with pytest.raises(IntegrityError, match="does not match its manifest"):
                await store.fetch("checkpoint-1/", files_of(wrong), tmp_path / "out",
                                  lambda n: None)


async def test_restore_unreachable_endpoint_fails_fast(
    stores: Make, tmp_path: Path, s3_server: SeaweedS3
) -> None:
    """An endpoint that never answered is reported at once, unretried, as a store that may
    be down for now (the daemon waits for it; a command says so and ends)."""
    config = s3_config(s3_server, "b", endpoint_url="http://127.0.0.1:9", retries=2)
    manifest = Manifest(run="run1", tag="checkpoint-1", step=1,
                        files=(FileEntry("a.bin", 10, "0" * 64),), writer=W)
    async with asyncio.timeout(20):
        with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as caught:
            await stores(config).fetch("checkpoint-1/", files_of(manifest), tmp_path / "out",
                                       lambda n: None)
    assert isinstance(caught.value, TransientStorageError)

"""Answers real stores and proxies give that traind must read right: interim ``100
Continue`` responses before the final one, chunked (``Transfer-Encoding: chunked``) ranged
GET bodies, and chunked error bodies, from a scripted HTTP/1.1 server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.integration.s3.conftest import MIB, RecordingSession, make_checkpoint
from tests.integration.s3.test_s3_store import files_of, manifest_of
from tests.support.net import serving

from traind import __version__
from traind.config import S3Storage
from traind.errors import StorageError, TransientStorageError
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.storage.s3.store import S3Store

pytestmark = pytest.mark.timeout(60)
Make = Callable[[S3Storage], S3Store]
PREFIX = "/wire/ckpts/run1/checkpoint-1/"
ERROR_HEAD = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\r\n<Error><Code>InvalidObjectState"
              b"</Code>\r\n<Message>The object is archived in tier 0\r\n")
"""The first chunk of an error body: its data ends in ``0\\r\\n``, so the chunk, with its
closing CRLF, ends in what also ends a chunked body (``0\\r\\n\\r\\n``)."""
ERROR_TAIL = b"and must be restored first</Message></Error>\r\n"


class Store:
    """A scripted S3 endpoint: PUTs answered after an interim ``100 Continue`` (asked for or
    not), ranged GETs answered with chunked bodies, keys ending in ``archived`` with a
    chunked error body sent in two pieces."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.put_headers: list[dict[str, str]] = []
        self.hold = 0
        """PUTs are answered only once this many have arrived (0: at once)."""
        self._held = asyncio.Event()
        self.continues = 0
        self.chunked_gets = 0
        self.errors = 0
        self.endpoint = ""
        self._rng = random.Random(5)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Store]:
        async with serving(self._serve) as self.endpoint:
            yield self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (f.partition(":") for f in fields if f)}
                path = target.partition("?")[0]
                if method == "PUT":
                    await self._put(path, headers, reader, writer)
                elif method == "GET":
                    await self._get(path, headers, writer)
                else:
                    writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()

    async def _put(self, path: str, headers: dict[str, str], reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        self.put_headers.append(headers)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        self.continues += 1
        body = await reader.readexactly(int(headers["content-length"]))
        self.objects[path] = body
        if len(self.objects) >= self.hold:
            self._held.set()
        await self._held.wait()
        etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
        writer.write(f'HTTP/1.1 200 OK\r\nETag: "{etag}"\r\nContent-Length: 0\r\n\r\n'.encode())

    async def _get(self, path: str, headers: dict[str, str],
                   writer: asyncio.StreamWriter) -> None:
        if path.endswith("archived"):
            self.errors += 1
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n" % len(ERROR_HEAD) + ERROR_HEAD + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.3)  # the rest arrives in a later read
            writer.write(b"%x\r\n" % len(ERROR_TAIL) + ERROR_TAIL + b"\r\n0\r\n\r\n")
            return
        data = self.objects[path]
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last) + 1, len(data))
        self.chunked_gets += 1
        writer.write(f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end - 1}/"
                     f"{len(data)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        pos = start
        while pos < end:
            n = min(end - pos, self._rng.randint(1, 300_000))
            writer.write(b"%x\r\n" % n + data[pos : pos + n] + b"\r\n")
            await writer.drain()
            pos += n
        writer.write(b"0\r\n\r\n")


def config(endpoint: str, **overrides: object) -> S3Storage:
    """A config for the scripted store (path-style keys under bucket ``wire``)."""
    values: dict[str, object] = {
        "type": "s3", "bucket": "wire", "prefix": "ckpts", "endpoint_url": endpoint,
        "region": "us-east-1", "addressing_style": "path", "access_key_id": "k",
        "secret_access_key": "s", "concurrency": 3, "retries": 3, "retry_max_delay": 0.5,
        "connect_timeout": 2.0, "read_timeout": 5.0,
    }
    return S3Storage(**(values | overrides))


async def test_an_interim_100_continue_is_not_the_answer(
    stores: Make, tmp_path: Path
) -> None:
    """A ``100 Continue`` before the final response, though not asked for, is passed over:
    the objects are stored whole and the upload succeeds."""
    root = tmp_path / "checkpoint-1"
    files = make_checkpoint(root, {"config.json": 3000, "model.bin": 2 * MIB + 7})
    session = RecordingSession()
    async with Store().running() as store:
        async with asyncio.timeout(30):
            await stores(config(store.endpoint)).send("checkpoint-1/", root, files, session)
    assert store.continues == 2
    for f in files:
        data = (root / f.path).read_bytes()
        assert store.objects[PREFIX + f.path] == data
        assert session.done[f.path] == hashlib.sha256(data).hexdigest()


async def test_puts_ask_for_no_100_continue_and_name_traind(
    stores: Make, tmp_path: Path
) -> None:
    """PUTs go without ``Expect: 100-continue`` (no wait for the store before each body)
    and with traind's User-Agent."""
    root = tmp_path / "checkpoint-1"
    files = make_checkpoint(root, {"config.json": 3000, "model.bin": 2 * MIB + 7})
    async with Store().running() as store:
        async with asyncio.timeout(30):
            await stores(config(store.endpoint)).send(
                "checkpoint-1/", root, files, RecordingSession())
    assert len(store.put_headers) == 2
    for headers in store.put_headers:
        assert "expect" not in headers
        assert headers["user-agent"].startswith(f"traind/{__version__} aiobotocore/")


async def test_small_files_go_several_per_slot(stores: Make, tmp_path: Path) -> None:
    """Files sent in one PUT are in flight several per ``concurrency`` slot: with one slot,
    four small files are all at the store before it answers any."""
    root = tmp_path / "checkpoint-1"
    files = make_checkpoint(root, {f"rank{i}.distcp": 3000 + i for i in range(4)})
    store = Store()
    store.hold = 4
    async with store.running():
        async with asyncio.timeout(30):
            await stores(config(store.endpoint, concurrency=1, retries=0)).send(
                "checkpoint-1/", root, files, RecordingSession())
    assert len(store.objects) == 4


async def test_a_chunked_ranged_get_is_received_whole(
    stores: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranged GETs answered with chunked bodies (no Content-Length, chunks of any size)
    restore every byte, checked against the manifest's sizes and hashes."""
    monkeypatch.setattr("traind.storage.s3.store.RANGE_SIZE", MIB)
    root = tmp_path / "checkpoint-1"
    make_checkpoint(root, {"model.bin": 3 * MIB + 5, "config.json": 900})
    store = Store()
    store.objects = {PREFIX + p.name: p.read_bytes() for p in root.iterdir()}
    manifest = manifest_of("checkpoint-1", root, {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()})
    async with store.running():
        async with asyncio.timeout(30):
            got = await stores(config(store.endpoint)).fetch(
                "checkpoint-1/", files_of(manifest), tmp_path / "out", lambda n: None)
    assert store.chunked_gets == 4 + 1  # four 1 MiB ranges of model.bin, one of config.json
    assert got == {f.path: f.sha256 for f in manifest.files}
    for f in manifest.files:
        assert (tmp_path / "out" / f.path).read_bytes() == (root / f.path).read_bytes()


async def test_a_chunked_error_body_is_read_to_its_end(
    stores: Make, tmp_path: Path
) -> None:
    """A chunked error body is read to its last chunk, even when one piece of it ends like
    the body's end: the error names S3's code and its whole message, and a permanent error
    is not retried."""
    manifest = Manifest(run="run1", tag="checkpoint-1", step=1,
                        files=(FileEntry("archived", 10, "0" * 64),), writer=Writer("a" * 32, "h"))
    async with Store().running() as store:
        async with asyncio.timeout(30):
            with pytest.raises(StorageError, match="InvalidObjectState") as caught:
                await stores(config(store.endpoint)).fetch(
                    "checkpoint-1/", files_of(manifest), tmp_path / "out", lambda n: None)
    assert "must be restored first" in str(caught.value)
    assert not isinstance(caught.value, TransientStorageError)
    assert store.errors == 1

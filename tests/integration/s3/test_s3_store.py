"""The S3 store against a real SeaweedFS, alone and under the checkpoint protocol: round
trip, multipart, errors, probe, cleanup."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs
from tests.integration.s3.conftest import (
    MIB,
    RecordingSession,
    Sent,
    make_checkpoint,
    s3_config,
)
from tests.support.net import free_ports
from tests.support.seaweed import READONLY_ACCESS_KEY, READONLY_SECRET_KEY, SeaweedS3

from traind.config import S3Storage
from traind.errors import StorageError, TransientStorageError
from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore
from traind.storage import LocalFile
from traind.storage.s3 import client as s3_client
from traind.storage.s3 import store as s3
from traind.storage.s3.client import Ops, PartBody
from traind.storage.s3.store import S3Store
from traind.storage.s3.upload import Resume

pytestmark = pytest.mark.timeout(60)
Make = Callable[[S3Storage], CheckpointStore]
MakeStore = Callable[[S3Storage], S3Store]


def manifest_of(tag: str, root: Path, done: dict[str, str]) -> Manifest:
    """The manifest the streamer would write for what the store reported."""
    files = tuple(FileEntry(p, (root / p).stat().st_size, sha) for p, sha in sorted(done.items()))
    return Manifest(run="run1", tag=tag, step=int(tag.rpartition("-")[2]), files=files,
                    writer=Writer("a" * 32, "h"))


def files_of(manifest: Manifest) -> list[LocalFile]:
    """The files of ``manifest`` as a fetch takes them."""
    return [LocalFile(f.path, f.size) for f in manifest.files]


def keys_under(server: SeaweedS3, bucket: str, prefix: str) -> list[str]:
    """Every object key under ``prefix``."""
    client = server.client()
    try:
        page = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for obj in page.get("Contents", []))
    finally:
        client.close()


async def test_round_trip(
    s3_server: SeaweedS3, bucket: str, backends: Make, tmp_path: Path, sent: list[Sent],
) -> None:
    """Upload, commit, list, download and delete keep every byte and the manifest contract,
    with every file's bytes sent as a zero-copy ``PartBody``; the store logs no event of
    its own for them (checkpoint_committed and checkpoint_restored are those facts' one
    event)."""
    root = tmp_path / "checkpoint-100"
    files = make_checkpoint(root, {
        "model.safetensors": 7 * MIB + 123, "config.json": 300, "sub/optimizer.pt": 40_000,
        "empty.txt": 0,
    })
    backend = backends(s3_config(s3_server, bucket))
    session = RecordingSession()
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            await backend.upload("checkpoint-100", root, files, session)
            assert await backend.manifests() == []  # objects without a manifest: no checkpoint
            manifest = manifest_of("checkpoint-100", root, session.done)
            await backend.commit(manifest)
            listed = await backend.manifests()
            got = await backend.download(listed[0], tmp_path / "restore", lambda n: None)
    assert not {e["event"] for e in logs} & {"s3_uploaded", "s3_committed", "s3_downloaded"}
    assert listed == [manifest]
    assert session.advanced == sum(f.size for f in files)
    # The large file's 2 parts and the 3 small files (not the claim's or manifest's PUTs).
    puts = [r for r in sent if r.op in {"PutObject", "UploadPart"} and "traind" not in r.url]
    assert sorted(r.op for r in puts) == ["PutObject"] * 3 + ["UploadPart"] * 2
    assert {r.body for r in puts} == {PartBody}
    for f in files:
        data = (root / f.path).read_bytes()
        assert session.done[f.path] == hashlib.sha256(data).hexdigest()
        assert got[f.path] == session.done[f.path]
        assert (tmp_path / "restore" / f.path).read_bytes() == data
    prefix = "ckpts/run1/checkpoint-100/"
    assert len(keys_under(s3_server, bucket, prefix)) == len(files) + 1
    async with asyncio.timeout(10):
        await backend.delete("checkpoint-100")
        assert await backend.manifests() == []
    assert keys_under(s3_server, bucket, prefix) == []


async def test_multipart_upload(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path
) -> None:
    """A 20 MiB file goes up as 5 MiB parts and reads back byte for byte, in ranges."""
    root = tmp_path / "checkpoint-7"
    files = make_checkpoint(root, {"shard.bin": 20 * MIB + 5})
    store = stores(s3_config(s3_server, bucket, part_size="5MiB", concurrency=3))
    session = RecordingSession()
    async with asyncio.timeout(30):
        await store.send("checkpoint-7/", root, files, session)
        got = await store.fetch("checkpoint-7/", files, tmp_path / "out", lambda n: None)
    client = s3_server.client()
    head = client.head_object(Bucket=bucket, Key="ckpts/run1/checkpoint-7/shard.bin")
    client.close()
    assert head["ETag"].strip('"').endswith("-5")  # 4 full parts and a 5-byte tail
    assert head["ContentLength"] == 20 * MIB + 5
    expected = hashlib.sha256((root / "shard.bin").read_bytes()).hexdigest()
    assert session.done == {"shard.bin": expected} == got
    assert session.states == {}


async def test_listing_pages_and_deleting_in_batches(
    s3_server: SeaweedS3, bucket: str, backends: Make, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Manifests are found across listing pages; a checkpoint is deleted manifest first (so
    a half-deleted one is never listed), then its objects in batches."""
    monkeypatch.setattr(s3_client, "LIST_PAGE", 2)
    monkeypatch.setattr(s3, "DELETE_BATCH", 2)
    backend = backends(s3_config(s3_server, bucket))
    tags = [f"checkpoint-{step}" for step in range(1, 6)]
    async with asyncio.timeout(30):
        for step, tag in enumerate(tags, 1):
            root = tmp_path / tag
            files = make_checkpoint(root, {"a.bin": 1000, "b.bin": 2000, "c.json": 10}, seed=step)
            session = RecordingSession()
            await backend.upload(tag, root, files, session)
            await backend.commit(manifest_of(tag, root, session.done))
        assert [m.tag for m in await backend.manifests()] == tags
    calls: list[tuple[str, list[str]]] = []
    original = Ops.call

    async def spy(self: Ops, op: str, key: str | None = None, **params: Any) -> Any:
        calls.append((op, [o["Key"] for o in params.get("Delete", {}).get("Objects", [])]))
        return await original(self, op, key, **params)

    monkeypatch.setattr(Ops, "call", spy)
    async with asyncio.timeout(30):
        await backend.delete("checkpoint-3")
        left = [m.tag for m in await backend.manifests()]
    assert left == [t for t in tags if t != "checkpoint-3"]
    prefix = "ckpts/run1/checkpoint-3/"
    # Each batch ends with the directories of its keys (for stores that list them empty).
    assert [keys for op, keys in calls if op == "delete_objects"] == [
        [prefix + MANIFEST_NAME, prefix],
        [prefix + "a.bin", prefix + "b.bin"], [prefix + "c.json", prefix],
        [prefix + CLAIM_NAME, prefix]]
    assert keys_under(s3_server, bucket, prefix) == []


async def test_a_malformed_manifest_is_left_out_and_named(
    s3_server: SeaweedS3, bucket: str, backends: Make, tmp_path: Path,
) -> None:
    """One damaged manifest does not hide the other checkpoints; the error names its key."""
    backend = backends(s3_config(s3_server, bucket))
    root = tmp_path / "checkpoint-1"
    files = make_checkpoint(root, {"a.bin": 1000})
    session = RecordingSession()
    client = s3_server.client()
    try:
        client.put_object(Bucket=bucket, Key=f"ckpts/run1/checkpoint-2/{MANIFEST_NAME}",
                          Body=b"{truncated")
    finally:
        client.close()
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            await backend.upload("checkpoint-1", root, files, session)
            await backend.commit(manifest_of("checkpoint-1", root, session.done))
            assert [m.tag for m in await backend.manifests()] == ["checkpoint-1"]
    [error] = [e for e in logs if e["event"] == "manifest_unreadable"]
    assert error["where"] == f"s3://{bucket}/ckpts/run1/checkpoint-2/{MANIFEST_NAME}"


async def test_when_required_sends_no_checksums(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path, sent: list[Sent],
) -> None:
    """``request_checksum_calculation = "when_required"`` (for stores that refuse them) sends
    no CRC32 with parts or whole objects; the default sends one with each."""
    sizes = {"shard.bin": 6 * MIB, "config.json": 100}
    for setting, tag in (("when_required", "checkpoint-1"), ("when_supported", "checkpoint-2")):
        root = tmp_path / tag
        files = make_checkpoint(root, sizes)
        store = stores(s3_config(s3_server, bucket, request_checksum_calculation=setting))
        session = RecordingSession()
        sent.clear()
        async with asyncio.timeout(30):
            await store.send(f"{tag}/", root, files, session)
        headers = [r.headers for r in sent if r.op in {"PutObject", "UploadPart"}]
        async with asyncio.timeout(30):
            got = await store.fetch(f"{tag}/", files, tmp_path / f"out-{tag}", lambda n: None)
        assert got == session.done
        assert len(headers) == 3  # two parts and the small file
        with_crc = ["x-amz-checksum-crc32" in h for h in headers]
        assert with_crc == [setting == "when_supported"] * 3, setting


async def test_max_bandwidth_caps_uploads_and_restores(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path
) -> None:
    """``max_bandwidth`` holds both directions to its rate (after a burst of one second's
    worth): 24 MiB at 8 MiB/s take at least 2 s each way."""
    root = tmp_path / "checkpoint-4"
    files = make_checkpoint(root, {"shard.bin": 20 * MIB, "config.json": 4 * MIB})
    store = stores(s3_config(s3_server, bucket, max_bandwidth="8MiB"))
    session = RecordingSession()
    async with asyncio.timeout(30):
        started = time.monotonic()
        await store.send("checkpoint-4/", root, files, session)
        up = time.monotonic() - started
        again = stores(s3_config(s3_server, bucket, max_bandwidth="8MiB"))
        started = time.monotonic()
        await again.fetch("checkpoint-4/", files, tmp_path / "out", lambda n: None)
        down = time.monotonic() - started
    assert up >= 1.9, up
    assert down >= 1.9, down


class SlowJournal(RecordingSession):
    """A session whose saves take ``delay`` seconds (an fsync behind a busy disk)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.saved: list[Resume] = []

    async def save_state(self, path: str, state: str) -> None:
        await asyncio.sleep(self.delay)
        resume = Resume.from_json(state)
        assert resume is not None
        self.saved.append(resume)
        await super().save_state(path, state)


async def test_slow_resume_saves_do_not_queue_one_per_part(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path
) -> None:
    """Parts finishing while a save is under way share the next save: a slow journal costs
    a few saves' time, not one per part, and every part still ends up recorded."""
    root = tmp_path / "checkpoint-3"
    files = make_checkpoint(root, {"shard.bin": 16 * 5 * MIB})
    store = stores(s3_config(s3_server, bucket, part_size="5MiB", concurrency=4))
    session = SlowJournal(delay=0.5)
    async with asyncio.timeout(30):
        await store.send("checkpoint-3/", root, files, session)
    done = [set(r.parts) for r in session.saved[1:]]  # [0]: the new upload, before any part
    assert len(done) < 16 / 2
    assert all(a < b for a, b in itertools.pairwise(done))
    assert done[-1] == set(range(1, 17))
    assert session.advanced == 16 * 5 * MIB


class HeldRecords(RecordingSession):
    """A session whose journal records are written only once every byte has been sent."""

    async def file_done(self, path: str, sha256: str) -> None:
        await self.progress.reached.wait()
        await super().file_done(path, sha256)


async def test_journal_records_do_not_hold_sending_slots(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path
) -> None:
    """A file waiting for its journal record no longer holds its sending slot: with one
    slot, the next files are sent while the first file's record is still unwritten."""
    root = tmp_path / "checkpoint-4"
    files = make_checkpoint(root, {f"rank{i}.distcp": 3000 + i for i in range(4)})
    store = stores(s3_config(s3_server, bucket, concurrency=1))
    session = HeldRecords(threshold=sum(f.size for f in files))
    async with asyncio.timeout(30):
        await store.send("checkpoint-4/", root, files, session)
    assert sorted(session.done) == sorted(f.path for f in files)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        if exc.errno == errno.EBADF:
            return False
        raise
    return True


async def test_cancelled_upload_closes_its_file_after_the_read_in_flight(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancelled upload leaves a part's read running in its thread: the file stays open
    until that read ends (closed under it, the number could be another file's by then)."""
    root = tmp_path / "checkpoint-2"
    files = make_checkpoint(root, {"shard.bin": 12 * MIB})
    entered, go_on = threading.Event(), threading.Event()
    fds: list[int] = []
    real = os.preadv

    def held(fd: int, buffers: Any, offset: int) -> int:
        if not fds:  # the first part's read: hold it
            fds.append(fd)
            entered.set()
            go_on.wait(10)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", held)
    store = stores(s3_config(s3_server, bucket))
    task = asyncio.create_task(store.send("checkpoint-2/", root, files, RecordingSession()))
    assert await asyncio.to_thread(entered.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert is_open(fds[0])  # the read holds it
    go_on.set()
    for _ in range(100):
        if not is_open(fds[0]):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the file was not closed after the read ended")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"bucket": "no-such-bucket-here"}, "bucket 'no-such-bucket-here' does not exist"),
        ({"secret_access_key": "wrong-secret"}, "secret access key does not match"),
        ({"access_key_id": "NOBODY"}, "access key id is not known"),
    ],
)
async def test_permanent_errors_fail_fast(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore, tmp_path: Path,
    overrides: dict[str, str], message: str,
) -> None:
    """A wrong bucket or credential raises StorageError naming the problem, without retries
    (a 4 MiB body: the store may answer before it has read it all)."""
    files = make_checkpoint(tmp_path, {"a.bin": 4 * MIB})
    store = stores(s3_config(s3_server, **({"bucket": bucket} | overrides)))
    started = time.monotonic()
    with pytest.raises(StorageError, match=message) as info:
        async with asyncio.timeout(10):
            await store.send("checkpoint-1/", tmp_path, files, RecordingSession())
    assert not isinstance(info.value, TransientStorageError)
    assert "wrong-secret" not in str(info.value)
    assert time.monotonic() - started < 3


async def test_unreachable_endpoint_fails_fast(stores: MakeStore, tmp_path: Path) -> None:
    """An endpoint where nothing listens is reported as unreachable at once, not retried,
    and as transient: it may be a store that is down for now."""
    (port,) = free_ports(1)
    config = S3Storage(type="s3", bucket="b", endpoint_url=f"http://127.0.0.1:{port}",
                       region="us-east-1", access_key_id=SecretStr("k"),
                       secret_access_key=SecretStr("s"))
    store = stores(config)
    started = time.monotonic()
    with pytest.raises(StorageError, match=f"cannot reach the S3 endpoint http://127.0.0.1:{port}"
                       ) as caught:
        async with asyncio.timeout(10):
            await store.list_dirs()
    assert time.monotonic() - started < 3
    assert isinstance(caught.value, TransientStorageError)


async def test_probe_reports_the_failing_step(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore
) -> None:
    """probe() passes with write access and names the step that fails otherwise."""
    async with asyncio.timeout(20):
        await stores(s3_config(s3_server, bucket)).probe()
        reader = stores(s3_config(s3_server, bucket, access_key_id=READONLY_ACCESS_KEY,
                                    secret_access_key=READONLY_SECRET_KEY))
        with pytest.raises(StorageError, match="probe failed at write probe object: access denied"):
            await reader.probe()
        wrong = stores(s3_config(s3_server, bucket, secret_access_key="wrong-secret"))
        with pytest.raises(StorageError, match="probe failed at head bucket: the secret access"):
            await wrong.probe()
        missing = stores(s3_config(s3_server, "missing-bucket"))
        with pytest.raises(StorageError, match="probe failed at head bucket: bucket 'missing"):
            await missing.probe()
    assert keys_under(s3_server, bucket, "") == []


async def test_cleanup_aborts_abandoned_uploads(
    s3_server: SeaweedS3, bucket: str, stores: MakeStore
) -> None:
    """abort_uploads() aborts our run's multipart uploads except those kept, and nobody else's."""
    client = s3_server.client()
    try:
        def start(key: str) -> str:
            return str(client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])

        kept = start("ckpts/run1/checkpoint-5/a.bin")
        start("ckpts/run1/checkpoint-4/a.bin")
        start("ckpts/run1/checkpoint-4/b.bin")
        other = start("ckpts/run2/checkpoint-4/a.bin")
        async with asyncio.timeout(20):
            state = Resume(kept, "ckpts/run1/checkpoint-5/a.bin", 1, 1, 5 * MIB, crc=False)
            aborted = await stores(s3_config(s3_server, bucket)).abort_uploads(
                "", [state.to_json()])
        left = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    finally:
        client.close()
    assert aborted == 2
    assert sorted(u["UploadId"] for u in left) == sorted([kept, other])


ODD_NAMES = {
    "a b.bin": 6 * MIB + 1, "ü/ñ.json": 30, "$(touch pwned) 'q' \"dq\" `x`.bin": 100,
    "dir with space/日本語 ünï+%20&?#.bin": 200, "-- lead": 1,
}
"""Legal file names that URL-encoding, signing or listing would get wrong if mishandled."""


async def test_odd_file_names_round_trip(
    s3_server: SeaweedS3, bucket: str, backends: Make, tmp_path: Path
) -> None:
    """Spaces, non-ASCII letters, quotes, ``$`` and URL syntax in file names are stored as
    those UTF-8 keys (a multipart one among them), restored byte-identical, cleaned up when
    abandoned and deleted."""
    root = tmp_path / "checkpoint-3"
    files = make_checkpoint(root, ODD_NAMES)
    backend = backends(s3_config(s3_server, bucket))
    session = RecordingSession()
    async with asyncio.timeout(30):
        await backend.upload("checkpoint-3", root, files, session)
        manifest = manifest_of("checkpoint-3", root, session.done)
        await backend.commit(manifest)
        assert await backend.manifests() == [manifest]
        got = await backend.download(manifest, tmp_path / "restore", lambda n: None)
    prefix = "ckpts/run1/checkpoint-3/"
    assert keys_under(s3_server, bucket, prefix) == sorted(
        [prefix + name for name in ODD_NAMES] + [prefix + MANIFEST_NAME]
    )
    for name in ODD_NAMES:
        data = (root / name).read_bytes()
        assert got[name] == session.done[name] == hashlib.sha256(data).hexdigest()
        assert (tmp_path / "restore" / name).read_bytes() == data
    client = s3_server.client()
    try:  # an upload abandoned mid-way under an odd name is found and aborted
        client.create_multipart_upload(Bucket=bucket, Key=prefix + "a b.bin")
        async with asyncio.timeout(10):
            assert await backend.cleanup([]) == 1
        assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    finally:
        client.close()
    async with asyncio.timeout(10):
        await backend.delete("checkpoint-3")
    assert keys_under(s3_server, bucket, prefix) == []

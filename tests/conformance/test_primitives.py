"""The store primitives, the same tests on every store (``object_store``'s shared integration
tests): create-only and replace-if-version puts, whole and ranged gets, listing past 1,000
keys, deletes, and names with spaces, Unicode and leading ``#``, ``;``, ``-``, ``~``."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from tests.conformance.conftest import Stores
from tests.support.sessions import RecordingSession

from traind.errors import IntegrityError, StorageError
from traind.storage import LocalFile
from traind.storage.base import CREATE, update

ODD_NAMES = ["#hash !bang ~tilde.bin", ";semicolon-first.bin", "-dash-first.bin",
             "~tilde-first.bin", "with space/and more space.bin", "unicodé/日本語.bin"]


def _write(root: Path, files: dict[str, bytes]) -> list[LocalFile]:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return [LocalFile(rel, len(data)) for rel, data in files.items()]


async def test_create_only_lets_one_writer_through(stores: Stores) -> None:
    """A create-only put makes the object once; a second one, from another handle, is
    refused and leaves the first bytes (on stores that claim the capability)."""
    one, two = stores.make(), stores.make()
    caps = await one.capabilities()
    async with asyncio.timeout(30):
        assert await one.put("t/obj.json", b"first", CREATE)
        second = await two.put("t/obj.json", b"second", CREATE)
        found = await one.get("t/obj.json")
    assert found is not None
    if caps.create:
        assert not second
        assert found.data == b"first"


async def test_replace_if_version_is_a_compare_and_swap(stores: Stores) -> None:
    """An update with the version read goes through once; with a stale version, or on a
    missing object, it is refused."""
    store = stores.make()
    async with asyncio.timeout(30):
        await store.put("t/lease.json", b"v1")
        first = await store.get("t/lease.json")
        assert first is not None
        assert await store.put("t/lease.json", b"v2", update(first.version))
        assert not await store.put("t/lease.json", b"v3", update(first.version))
        assert not await store.put("t/none.json", b"x", update(first.version))
        now = await store.get("t/lease.json")
        assert await store.get("t/none.json") is None
    assert now is not None
    assert now.data == b"v2"
    assert now.version != first.version


async def test_ranges_head_and_missing(stores: Stores) -> None:
    """A range returns those bytes (fewer at the end); head gives the size; a missing
    object is None from get and head, and a missing error from get_range."""
    store = stores.make()
    data = bytes(range(256)) * 40
    async with asyncio.timeout(30):
        await store.put("t/blob", data)
        assert await store.get_range("t/blob", 100, 300) == data[100:300]
        assert await store.get_range("t/blob", len(data) - 5, len(data) + 100) == data[-5:]
        meta = await store.head("t/blob")
        assert await store.head("t/absent") is None
        assert await store.get("t/absent") is None
        with pytest.raises(StorageError) as missing:
            await store.get_range("t/absent", 0, 10)
    assert meta is not None
    assert meta.size == len(data)
    assert missing.value.missing


async def test_listing_past_a_thousand_keys(stores: Stores) -> None:
    """A listing returns every key under its prefix, past one page of 1,000, with sizes;
    a name prefix lists only the names that start with it; list_dirs gives the tags."""
    store = stores.make()
    keys = [f"big/f-{i:04d}" for i in range(1003)]
    async with asyncio.timeout(120):
        await _many(store.put, [(k, b"x" * (i % 7)) for i, k in enumerate(keys)])
        await store.put("other/a/b", b"12")
        listed = {m.key: m.size for m in await store.list("big/")}
        named = sorted(m.key for m in await store.list("big/f-100"))
        dirs = await store.list_dirs()
        nested = await store.list_dirs("other/")
    assert listed == {k: i % 7 for i, k in enumerate(keys)}
    assert named == ["big/f-1000", "big/f-1001", "big/f-1002"]
    assert dirs == ["big", "other"]
    assert nested == ["a"]


async def _many(put: object, items: list[tuple[str, bytes]]) -> None:
    sem = asyncio.Semaphore(16)

    async def one(key: str, data: bytes) -> None:
        async with sem:
            await put(key, data)  # type: ignore[operator]

    await asyncio.gather(*(one(k, d) for k, d in items))


async def test_delete_is_batched_and_missing_is_fine(stores: Stores) -> None:
    """Deleting keys removes exactly them, missing ones included without error; a tag
    whose last object went is no longer listed."""
    store = stores.make()
    async with asyncio.timeout(30):
        for key in ["d/a", "d/sub/b", "e/c"]:
            await store.put(key, b"1")
        await store.delete(["d/a", "d/sub/b", "d/never"])
        left = sorted(m.key for m in await store.list(""))
        dirs = await store.list_dirs()
    assert left == ["e/c"]
    assert dirs == ["e"]


async def test_odd_names_sent_and_fetched_whole(stores: Stores, tmp_path: Path) -> None:
    """Files named with spaces, Unicode and a leading ``#``, ``;``, ``-`` or ``~`` are all
    stored by the bulk send (every transfer mode), listed with their sizes, and fetched
    back with the right sha256."""
    store = stores.make()
    files = {name: f"{name}\n".encode() * (i + 1) for i, name in enumerate(ODD_NAMES)}
    files["big.bin"] = bytes(range(256)) * 8192
    local = _write(tmp_path / "src", files)
    session = RecordingSession()
    async with asyncio.timeout(60):
        await stores.sent(store, "checkpoint-1/", tmp_path / "src", local, session)
        listed = {m.key: m.size for m in await store.list("checkpoint-1/")}
        back = await store.fetch("checkpoint-1/", local, tmp_path / "back", lambda n: None)
    want = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    assert session.done == want
    assert {k.removeprefix("checkpoint-1/"): v for k, v in listed.items()
            if not k.endswith(".traind-part")} == {r: len(d) for r, d in files.items()}
    assert back == want
    assert sum(n for n, _ in session.advances) == sum(len(d) for d in files.values())


async def test_fetch_of_a_missing_file_is_an_integrity_error(stores: Stores,
                                                             tmp_path: Path) -> None:
    """Fetching a file that is not in the store says the checkpoint does not match its
    manifest (IntegrityError), not that the store failed."""
    store = stores.make()
    async with asyncio.timeout(30):
        with pytest.raises(IntegrityError):
            await store.fetch("checkpoint-9/", [LocalFile("gone.bin", 10)], tmp_path / "b",
                              lambda n: None)


async def test_probe_says_how_a_tag_stays_one_writers(stores: Stores) -> None:
    """The probe passes on a working store, and its capabilities name the claim used."""
    store = stores.make()
    async with asyncio.timeout(30):
        await store.probe()
        caps = await store.capabilities()
    assert caps.claim
    if stores.kind in {"s3-listed", "s3-obstore-listed"}:
        assert not caps.create

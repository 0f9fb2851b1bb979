"""What is planted in a store backed by a directory is input: nothing is written or read
through a symbolic link at or below the run's directory, and a stored file that is not a
regular file of its manifest's size (a FIFO, a link to ``/dev/zero``, a directory) is that
checkpoint's corruption, an IntegrityError naming it, never a hang or a store failure."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from tests.conformance.conftest import Stores, on_disk
from tests.support.sessions import NoSession, RecordingSession

from traind.errors import IntegrityError, LinkedPathError
from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.storage import LocalFile
from traind.storage.base import CREATE

WITHIN = 30
"""Seconds any one case may take: what would hang fails by this instead."""


def _outside(tmp_path: Path) -> Path:
    """A directory outside the store holding a file a link could lead to."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.bin").write_bytes(b"not the store's")
    return elsewhere


def _state(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _local(tmp_path: Path, data: bytes = b"weights") -> tuple[Path, list[LocalFile]]:
    """A local checkpoint of one file, ``model.bin``."""
    root = tmp_path / "local"
    root.mkdir()
    (root / "model.bin").write_bytes(data)
    return root, [LocalFile("model.bin", len(data))]


def _manifest(tag: str, step: int) -> bytes:
    """A committed checkpoint's manifest of one file."""
    entry = FileEntry("model.bin", 7, "0" * 64)
    return Manifest(run="run", tag=tag, step=step, files=(entry,), created_at=1.0,
                    host="h", writer=Writer("a" * 32, "h")).to_json()


@on_disk
async def test_nothing_written_through_a_linked_tag(stores: Stores, tmp_path: Path) -> None:
    """A tag directory that is a link to a directory elsewhere: the claim, the files and a
    delete are refused with LinkedPathError naming it, and nothing elsewhere changes."""
    elsewhere = _outside(tmp_path)
    stores.directory.mkdir(parents=True)
    (stores.directory / "checkpoint-3").symlink_to(elsewhere)
    before = _state(elsewhere)
    store = stores.make()
    root, files = _local(tmp_path)
    async with asyncio.timeout(WITHIN):
        with pytest.raises(LinkedPathError, match="checkpoint-3 is a symbolic link"):
            await store.put(f"checkpoint-3/{CLAIM_NAME}", b"{}", CREATE)
        with pytest.raises(LinkedPathError, match="checkpoint-3 is a symbolic link"):
            await store.send("checkpoint-3/", root, files, NoSession())
        with pytest.raises(LinkedPathError, match="checkpoint-3 is a symbolic link"):
            await store.delete(["checkpoint-3/model.bin"])
        assert await store.list("checkpoint-3/") == []
        assert "checkpoint-3" not in await store.list_dirs()
    assert _state(elsewhere) == before


@on_disk
async def test_nothing_read_through_a_linked_tag(stores: Stores, tmp_path: Path) -> None:
    """Through a linked tag directory, reading a file or the manifest is that checkpoint's
    IntegrityError, naming the link; other checkpoints are listed as ever."""
    elsewhere = _outside(tmp_path)
    (elsewhere / MANIFEST_NAME).write_bytes(_manifest("checkpoint-3", 3))
    store = stores.make()
    async with asyncio.timeout(WITHIN):
        await store.put(f"checkpoint-1/{MANIFEST_NAME}", _manifest("checkpoint-1", 1))
        (stores.directory / "checkpoint-3").symlink_to(elsewhere)
        with pytest.raises(IntegrityError, match="checkpoint-3 is a symbolic link"):
            await store.get(f"checkpoint-3/{MANIFEST_NAME}")
        with pytest.raises(IntegrityError, match="checkpoint-3 is a symbolic link"):
            await store.fetch("checkpoint-3/", [LocalFile("model.bin", 15)], tmp_path / "d",
                              lambda n: None)
        listed = await stores.checkpoints().manifests()
    assert [m.tag for m in listed] == ["checkpoint-1"]
    assert not (tmp_path / "d" / "model.bin").exists()


@on_disk
async def test_a_linked_run_directory_is_refused(stores: Stores, tmp_path: Path) -> None:
    """The run's own directory a link: every write and every read is refused with
    LinkedPathError naming it, and nothing is written where it leads."""
    elsewhere = _outside(tmp_path)
    stores.directory.parent.mkdir(parents=True)
    stores.directory.symlink_to(elsewhere, target_is_directory=True)
    before = _state(elsewhere)
    store = stores.make()
    root, files = _local(tmp_path)
    async with asyncio.timeout(WITHIN):
        for call in (lambda: store.put(f"checkpoint-3/{CLAIM_NAME}", b"{}", CREATE),
                     lambda: store.send("checkpoint-3/", root, files, NoSession()),
                     lambda: store.get("model.bin"),
                     lambda: store.list_dirs(),
                     lambda: store.probe()):
            with pytest.raises(LinkedPathError, match=f"{stores.directory} is a symbolic link"):
                await call()
    assert _state(elsewhere) == before


@on_disk
async def test_a_linked_directory_inside_a_tag(stores: Stores, tmp_path: Path) -> None:
    """A directory inside a tag that is a link: a send into it is refused, a fetch from it
    is IntegrityError, a listing does not look inside it."""
    elsewhere = _outside(tmp_path)
    (stores.directory / "checkpoint-3").mkdir(parents=True)
    (stores.directory / "checkpoint-3" / "sub").symlink_to(elsewhere)
    before = _state(elsewhere)
    store = stores.make()
    root = tmp_path / "local"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "model.bin").write_bytes(b"weights")
    async with asyncio.timeout(WITHIN):
        with pytest.raises(LinkedPathError, match="checkpoint-3/sub is a symbolic link"):
            await store.send("checkpoint-3/", root, [LocalFile("sub/model.bin", 7)],
                             NoSession())
        with pytest.raises(IntegrityError, match="checkpoint-3/sub is a symbolic link"):
            await store.fetch("checkpoint-3/", [LocalFile("sub/model.bin", 15)],
                              tmp_path / "d", lambda n: None)
        assert await store.list("checkpoint-3/") == []
    assert _state(elsewhere) == before


@on_disk
async def test_a_linked_claim_is_not_written_through(stores: Stores, tmp_path: Path) -> None:
    """A claim that is a link to a file elsewhere: a put there is refused, the file it
    leads to is unchanged."""
    elsewhere = _outside(tmp_path)
    (stores.directory / "checkpoint-3").mkdir(parents=True)
    (stores.directory / "checkpoint-3" / CLAIM_NAME).symlink_to(elsewhere / "model.bin")
    store = stores.make()
    async with asyncio.timeout(WITHIN):
        with pytest.raises(LinkedPathError, match=f"{CLAIM_NAME} is a symbolic link"):
            await store.put(f"checkpoint-3/{CLAIM_NAME}", b"{}")
    assert (elsewhere / "model.bin").read_bytes() == b"not the store's"


def _plant(kind: str, at: Path, elsewhere: Path) -> None:
    """Put ``kind`` at ``at``: a link to a file of the manifest's size elsewhere, a link to
    ``/dev/zero``, a FIFO (no writer, ever) or a directory."""
    at.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link":
        (elsewhere / "same-size.bin").write_bytes(b"weights")
        at.symlink_to(elsewhere / "same-size.bin")
    elif kind == "dev-zero":
        at.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.mkdir()


PLANTED = ["link", "dev-zero", "fifo", "directory"]
EXPECTED = {"link": "a symbolic link", "dev-zero": "a symbolic link", "fifo": "a FIFO",
            "directory": "a directory"}


@on_disk
@pytest.mark.parametrize("planted", PLANTED)
async def test_a_data_file_not_regular_is_the_checkpoints_corruption(
        stores: Stores, tmp_path: Path, planted: str) -> None:
    """A data file that is a link, a link to /dev/zero, a FIFO or a directory: a fetch is an
    IntegrityError naming it, at once, nothing read; a file beside it still fetches."""
    store = stores.make()
    root = tmp_path / "local"
    root.mkdir()
    (root / "ok.bin").write_bytes(b"fine")
    async with asyncio.timeout(WITHIN):
        await stores.sent(store, "checkpoint-3/", root, [LocalFile("ok.bin", 4)],
                          RecordingSession())
        _plant(planted, stores.directory / "checkpoint-3" / "model.bin", _outside(tmp_path))
        moved: list[int] = []
        with pytest.raises(IntegrityError, match=f"model.bin is {EXPECTED[planted]}"):
            await store.fetch("checkpoint-3/", [LocalFile("model.bin", 7)], tmp_path / "d",
                              moved.append)
        assert sum(moved) == 0
        fetched = await store.fetch("checkpoint-3/", [LocalFile("ok.bin", 4)], tmp_path / "e",
                                    lambda n: None)
    assert (tmp_path / "e" / "ok.bin").read_bytes() == b"fine"
    assert set(fetched) == {"ok.bin"}


@on_disk
@pytest.mark.parametrize("planted", PLANTED)
async def test_a_manifest_not_regular_hides_only_its_checkpoint(
        stores: Stores, tmp_path: Path, planted: str) -> None:
    """A manifest that is a link, a FIFO or a directory: reading it is an IntegrityError
    naming it; listing the run's checkpoints passes over it and shows the others."""
    store = stores.make()
    async with asyncio.timeout(WITHIN):
        await store.put(f"checkpoint-1/{MANIFEST_NAME}", _manifest("checkpoint-1", 1))
        _plant(planted, stores.directory / "checkpoint-3" / MANIFEST_NAME, _outside(tmp_path))
        with pytest.raises(IntegrityError, match=f"{MANIFEST_NAME} is {EXPECTED[planted]}"):
            await store.get(f"checkpoint-3/{MANIFEST_NAME}")
        listed = await stores.checkpoints().manifests()
    assert [m.tag for m in listed] == ["checkpoint-1"]


@on_disk
async def test_no_file_is_read_past_its_manifest_size(stores: Stores, tmp_path: Path) -> None:
    """A stored file larger than its manifest says: an IntegrityError naming both sizes,
    before any byte is moved."""
    store = stores.make()
    root, files = _local(tmp_path, b"x" * (4 << 20))
    async with asyncio.timeout(WITHIN):
        await stores.sent(store, "checkpoint-3/", root, files, RecordingSession())
        moved: list[int] = []
        with pytest.raises(IntegrityError, match=r"model\.bin: size 4194304 != manifest 10"):
            await store.fetch("checkpoint-3/", [LocalFile("model.bin", 10)], tmp_path / "d",
                              moved.append)
    assert sum(moved) == 0


@on_disk
async def test_a_cancelled_fetch_stops_moving_bytes(stores: Stores, tmp_path: Path) -> None:
    """A fetch cancelled while it copies a large file stops within a chunk: nothing moves
    after the cancel returns (its worker is done; a stopping daemon's exit waits for it)."""
    store = stores.make()
    root, files = _local(tmp_path, os.urandom(32 << 20))
    loop = asyncio.get_running_loop()
    first = asyncio.Event()
    moved: list[float] = []

    def slowly(n: int) -> None:  # a slow disk or network, a chunk at a time
        moved.append(time.monotonic())
        loop.call_soon_threadsafe(first.set)
        time.sleep(0.05)

    async with asyncio.timeout(WITHIN):
        await stores.sent(store, "checkpoint-3/", root, files, RecordingSession())
        fetch = asyncio.ensure_future(store.fetch("checkpoint-3/", files, tmp_path / "d", slowly))
        await first.wait()
        fetch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        cancelled = time.monotonic()
        await asyncio.sleep(1.0)
    assert [t for t in moved if t > cancelled] == []
    assert len(moved) < 10

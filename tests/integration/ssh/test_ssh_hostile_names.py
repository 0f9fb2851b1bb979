"""Hostile tags and file names are rejected before any remote operation, or stored safely;
file names with spaces, non-ASCII letters and shell characters round-trip byte-identical."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.sessions import NoSession
from tests.support.sshd import SSHServer

from traind.checkpoints.restore.download import restore
from traind.errors import UnsafePathError
from traind.layout.keys import MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.storage import LocalFile

Checkpoint = Callable[[str, dict[str, bytes]], tuple[Path, list[LocalFile]]]
Store = Callable[..., Awaitable[Manifest]]

HOSTILE_TAGS = ["../x", "..", ";rm -rf ~", "a b", "ünïcode", "x/y", "$(touch pwned)", ""]
HOSTILE_PATHS = [
    "../escape", "/etc/passwd", "a/../../b", "a//b", "new\nline", "nul\0.bin", MANIFEST_NAME,
]
ODD_NAMES = {
    "a b.bin": b"space", "ü/ñ.json": b'{"n": 1}', "x;rm -rf ~": b"semicolon",
    "`touch pwned`": b"backticks", "$(touch pwned) 'q' \"dq\".bin": b"quotes and dollar",
    "dir with space/日本語 ünï.bin": b"nested unicode", "-- lead": b"dashes",
    "#comment.bin": b"hash first", ";comment.bin": b"semicolon first",
    "sub/#deeper ;x.bin": b"hash first, nested", "~tilde": b"tilde first",
}
"""Legal file names that a shell, a URL or rsync would misread if handed over unquoted (rsync
reads a ``--files-from`` entry starting with ``#`` or ``;`` as a comment)."""
HOSTILE_KEYS = ["../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a/.", "new\nline", "nul\0",
                ""]


@pytest.mark.parametrize("tag", HOSTILE_TAGS)
async def test_hostile_tag_is_rejected_everywhere(
    tag: str, sshd: SSHServer, make_backend: Callable[..., Any], remote: Path, tmp_path: Path
) -> None:
    """Every operation taking a tag refuses an unsafe one before touching the remote host."""
    backend = make_backend(sshd)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"a")
    manifest = Manifest(run="run1", tag="checkpoint-1", step=1,
                        files=(FileEntry("a.bin", 1, "0" * 64),), writer=Writer("a" * 32, "h"))
    object.__setattr__(manifest, "tag", tag)  # as if read from a tampered store
    async with asyncio.timeout(10):
        with pytest.raises(UnsafePathError):
            await backend.upload(tag, tmp_path / "src", [LocalFile("a.bin", 1)], NoSession())
        with pytest.raises(UnsafePathError):
            await backend.commit(manifest)
        with pytest.raises(UnsafePathError):
            await backend.download(manifest, tmp_path / "dl", lambda n: None)
        with pytest.raises(UnsafePathError):
            await backend.delete(tag)
    assert list(remote.iterdir()) == []
    assert not (tmp_path / "pwned").exists()
    assert sshd.sftp_operations() == []  # not even a connection was needed


@pytest.mark.parametrize("key", HOSTILE_KEYS)
async def test_hostile_key_is_rejected_by_every_primitive(
    key: str, sshd: SSHServer, make_store: Callable[..., Any], remote: Path, tmp_path: Path
) -> None:
    """Every primitive of the SSH store refuses a key that could leave the run's root before
    touching the remote host."""
    objects = make_store(sshd)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: objects.put(key, b"x"), lambda: objects.get(key),
        lambda: objects.get_range(key, 0, 1), lambda: objects.head(key),
        lambda: objects.list(f"{key}/"), lambda: objects.list_dirs(f"{key}/"),
        lambda: objects.delete(["t/ok", key]),
        lambda: objects.fetch(f"{key}/", [LocalFile("a.bin", 1)], tmp_path / "dl",
                              lambda n: None),
    ]
    async with asyncio.timeout(10):
        for call in calls:
            with pytest.raises(UnsafePathError):
                await call()
    assert list(remote.iterdir()) == []
    assert sshd.sftp_operations() == []  # not even a connection was needed


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
@pytest.mark.parametrize("path", HOSTILE_PATHS)
async def test_hostile_file_name_is_rejected(
    path: str, transfer: str, sshd: SSHServer, make_store: Callable[..., Any], remote: Path,
    tmp_path: Path,
) -> None:
    """An unsafe relative path fails the whole upload before anything is written remotely."""
    objects = make_store(sshd, transfer=transfer)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ok.bin").write_bytes(b"ok")
    files = [LocalFile("ok.bin", 2), LocalFile(path, 1)]
    async with asyncio.timeout(10):
        with pytest.raises(UnsafePathError):
            await objects.send("checkpoint-1/", tmp_path / "src", files, NoSession())
    assert list(remote.iterdir()) == []


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
async def test_option_like_names_are_stored_safely(
    transfer: str, sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint,
    store: Store, remote: Path, tmp_path: Path,
) -> None:
    """Valid names that look like options or hidden files land exactly where they belong."""
    backend = make_backend(sshd, transfer=transfer)
    contents = {
        "-e": b"dash e", "--delete": b"dash dash delete", "..a": b"dot dot a",
        ".hidden": b"hidden", "-rf/-x": b"nested", "--rsh": b"rsh",
    }
    root, files = checkpoint("-rf", contents)
    async with asyncio.timeout(30):
        await store(backend, "-rf", root, files)
        assert [m.tag for m in await backend.manifests()] == ["-rf"]
    tag_dir = remote / "store" / "run1" / "-rf"
    stored = {p.relative_to(remote).as_posix() for p in remote.rglob("*") if p.is_file()}
    assert stored == {f"store/run1/-rf/{name}" for name in [*contents, MANIFEST_NAME]}
    assert {name: (tag_dir / name).read_bytes() for name in contents} == contents
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
async def test_odd_file_names_round_trip(
    transfer: str, sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint,
    store: Store, remote: Path, tmp_path: Path,
) -> None:
    """Spaces, non-ASCII letters, quotes and ``$`` in file names are stored under exactly
    those names and restored byte-identical."""
    backend = make_backend(sshd, transfer=transfer)
    root, files = checkpoint("checkpoint-1", ODD_NAMES)
    async with asyncio.timeout(60):
        manifest = await store(backend, "checkpoint-1", root, files)
        dest = await restore(backend, manifest, tmp_path / "restored")
    tag_dir = remote / "store" / "run1" / "checkpoint-1"
    assert {n: (tag_dir / n).read_bytes() for n in ODD_NAMES} == ODD_NAMES
    restored = {p.relative_to(dest).as_posix(): p.read_bytes()
                for p in dest.rglob("*") if p.is_file()}
    assert restored == ODD_NAMES
    assert not (tmp_path / "pwned").exists()
    assert not (remote / "pwned").exists()

"""The local backend honours the storage contract."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import run_in

from traind.checkpoints.restore.download import find, restore
from traind.checkpoints.state.journal import Journal, JournalSession
from traind.config import LocalStorage
from traind.errors import IntegrityError, NotFoundError, StorageError
from traind.layout.keys import MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore, open_storage
from traind.storage import LocalFile

W = Writer("a" * 32, "h")


def make_checkpoint(root: Path) -> dict[str, bytes]:
    files = {
        "model.safetensors": os.urandom(3 * 1024 * 1024 + 7),
        "sub/opt.pt": b"x" * 100,
        "trainer_state.json": b'{"global_step": 4}',
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


async def upload(backend: CheckpointStore, tmp_path: Path, tag: str) -> Manifest:
    src = tmp_path / "src" / tag
    files = make_checkpoint(src)
    journal = Journal(tmp_path / f"j-{tag}.db", run_in(tmp_path))
    await journal.staged(tag, 4, src, [LocalFile(p, len(d)) for p, d in files.items()])
    await backend.upload(
        tag,
        src,
        [LocalFile(p, len(d)) for p, d in files.items()],
        JournalSession(journal, tag, lambda n: None),
    )
    stored = await journal.files(tag)
    journal.close()
    for f in stored:
        assert f.sha256 == hashlib.sha256(files[f.path]).hexdigest()
    manifest = Manifest(
        "run", tag, 4, tuple(FileEntry(f.path, f.size, f.sha256 or "") for f in stored),
        writer=W,
    )
    return manifest


async def test_round_trip(tmp_path: Path) -> None:
    """Upload, commit, list, restore verified, delete — bytes identical."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    manifest = await upload(backend, tmp_path, "checkpoint-4")
    assert await backend.manifests() == []  # files alone are not a checkpoint
    await backend.commit(manifest)
    assert [m.tag for m in await backend.manifests()] == ["checkpoint-4"]
    dest = await restore(backend, await find(backend, "latest"), tmp_path / "restored")
    for entry in manifest.files:
        assert (dest / entry.path).read_bytes() == (
            tmp_path / "src/checkpoint-4" / entry.path
        ).read_bytes()
    await backend.delete("checkpoint-4")
    assert await backend.manifests() == []
    assert not (tmp_path / "store/run/checkpoint-4").exists()


async def test_restore_refuses_corruption(tmp_path: Path) -> None:
    """A store file that no longer matches its manifest fails restore; nothing is left."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    manifest = await upload(backend, tmp_path, "checkpoint-4")
    await backend.commit(manifest)
    target = tmp_path / "store/run/checkpoint-4/sub/opt.pt"
    target.write_bytes(b"y" * 100)
    with pytest.raises(IntegrityError, match=r"sub/opt.pt: sha256"):
        await restore(backend, manifest, tmp_path / "restored")
    assert list((tmp_path / "restored").iterdir()) == []


async def test_restore_does_not_overwrite(tmp_path: Path) -> None:
    """Restoring over an existing directory is an error, never a silent overwrite."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    await backend.commit(await upload(backend, tmp_path, "checkpoint-4"))
    (tmp_path / "restored/checkpoint-4").mkdir(parents=True)
    with pytest.raises(StorageError, match="already exists"):
        await restore(backend, (await backend.manifests())[0], tmp_path / "restored")


async def test_restore_removes_what_killed_restores_left(tmp_path: Path) -> None:
    """A killed restore leaves its full-size temporary directory behind: the next restore
    into the same directory removes it, but not that of a restore still running."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    await backend.commit(await upload(backend, tmp_path, "checkpoint-4"))
    parent = tmp_path / "restored"
    dead = parent / ".checkpoint-3.traind-restore-dead0000"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "model.safetensors").write_bytes(b"\0" * 100_000)
    running = parent / ".checkpoint-4.traind-restore-busy0000"
    running.mkdir()
    unrelated = parent / ".checkpoint-4.keep"
    unrelated.mkdir()
    fd = os.open(running, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the running restore holds it
        await restore(backend, (await backend.manifests())[0], parent)
    finally:
        os.close(fd)
    assert sorted(p.name for p in parent.iterdir()) == sorted(
        [running.name, unrelated.name, "checkpoint-4"]
    )


async def test_a_malformed_manifest_is_left_out_and_named(tmp_path: Path) -> None:
    """One damaged manifest does not hide the other checkpoints; the error names its path."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    await backend.commit(await upload(backend, tmp_path, "checkpoint-4"))
    broken = tmp_path / "store/run/checkpoint-3" / MANIFEST_NAME
    broken.parent.mkdir()
    broken.write_bytes(b"\xff\xfe not json")
    with capture_logs() as logs:
        assert [m.tag for m in await backend.manifests()] == ["checkpoint-4"]
    [error] = [e for e in logs if e["event"] == "manifest_unreadable"]
    assert error["where"] == str(broken)


async def test_missing_tag(tmp_path: Path) -> None:
    """Asking for a tag that is not committed names what exists."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    await backend.commit(await upload(backend, tmp_path, "checkpoint-4"))
    with pytest.raises(NotFoundError, match=r"have: checkpoint-4"):
        await find(backend, "checkpoint-9")


async def test_interrupted_upload_is_invisible_and_deletable(tmp_path: Path) -> None:
    """Files without a manifest (an interrupted upload) are never listed; delete clears them."""
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    await upload(backend, tmp_path, "checkpoint-4")
    (tmp_path / "store/run/checkpoint-4/model.safetensors.traind-part").write_bytes(b"half")
    assert await backend.manifests() == []
    await backend.delete("checkpoint-4")
    assert not (tmp_path / "store/run/checkpoint-4").exists()


async def test_probe_reports_unwritable(tmp_path: Path) -> None:
    """probe() says precisely what is wrong with the store path."""
    (tmp_path / "file").write_text("not a dir")
    backend = open_storage(LocalStorage(path=tmp_path / "file"), "run")
    with pytest.raises(StorageError, match="local store"):
        await backend.probe()


async def test_odd_file_names_round_trip(tmp_path: Path) -> None:
    """Spaces, non-ASCII letters, quotes and ``$`` in file names are stored under exactly
    those names and restored byte-identical."""
    names = {"a b.bin": b"space", "ü/ñ.json": b"{}", "$(touch pwned) 'q' \"dq\" `x`.bin": b"q",
             "dir with space/日本語 ünï.bin": os.urandom(2 * 1024 * 1024 + 3)}
    src = tmp_path / "src" / "checkpoint-2"
    for rel, data in names.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    files = [LocalFile(p, len(d)) for p, d in names.items()]
    journal = Journal(tmp_path / "j.db", run_in(tmp_path))
    await journal.staged("checkpoint-2", 2, src, files)
    backend = open_storage(LocalStorage(path=tmp_path / "store"), "run")
    await backend.upload("checkpoint-2", src, files, JournalSession(journal, "checkpoint-2",
                                                                    lambda n: None))
    stored = await journal.files("checkpoint-2")
    journal.close()
    await backend.commit(Manifest(
        "run", "checkpoint-2", 2, tuple(FileEntry(f.path, f.size, f.sha256 or "") for f in stored),
        writer=W,
    ))
    assert {n: (tmp_path / "store/run/checkpoint-2" / n).read_bytes() for n in names} == names
    dest = await restore(backend, await find(backend, "latest"), tmp_path / "restored")
    restored = {p.relative_to(dest).as_posix(): p.read_bytes()
                for p in dest.rglob("*") if p.is_file()}
    assert restored == names
    assert not (tmp_path / "pwned").exists()

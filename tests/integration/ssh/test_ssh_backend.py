"""The SSH store against a real OpenSSH sshd, with the checkpoint protocol over it: the
storage contract in every transfer mode."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.sessions import RecordingSession
from tests.support.sshd import SSHServer

from traind.errors import IntegrityError
from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.manifest import Manifest, verify
from traind.storage import LocalFile

Checkpoint = Callable[[str, dict[str, bytes]], tuple[Path, list[LocalFile]]]
Store = Callable[..., Awaitable[Manifest]]

CONTENTS = {
    "model.safetensors": os.urandom(3 * 1024 * 1024 + 17),
    "optimizer/state.bin": os.urandom(700_000),
    "trainer_state.json": b'{"global_step": 1}',
    "empty.txt": b"",
}


def _renames(ops: list[str]) -> list[str]:
    """Targets of the SFTP posix-renames and hard links (exclusive creates) in the server's
    operation log, in order; but those of the store's one check of its exclusive create."""
    targets = [op.rsplit(' new "', 1)[1].rstrip('"') for op in ops
               if op.startswith(("posix-rename", "hardlink"))]
    return [t for t in targets if not Path(t).name.startswith(".traind-probe-")]


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
async def test_round_trip(
    transfer: str, sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint,
    store: Store, remote: Path, tmp_path: Path,
) -> None:
    """Upload, commit, list, download-and-verify and delete a checkpoint, manifest last/first;
    the upload logs no event of its own (checkpoint_committed is that fact's one event)."""
    backend = make_backend(sshd, transfer=transfer)
    root, files = checkpoint("checkpoint-7", CONTENTS)
    tag_dir = remote / "store" / "run1" / "checkpoint-7"
    async with asyncio.timeout(30):
        with capture_logs() as logs:
            manifest = await store(backend, "checkpoint-7", root, files)
        assert "ssh_upload_done" not in {e["event"] for e in logs}

        assert {p.relative_to(tag_dir).as_posix(): p.read_bytes()
                for p in tag_dir.rglob("*") if p.is_file()} == {**CONTENTS, MANIFEST_NAME: (
                    manifest.to_json())}
        renames = _renames(sshd.sftp_operations())
        assert renames[-1] == str(tag_dir / MANIFEST_NAME)  # the manifest goes last
        if transfer != "rsync":  # each file arrived under a temporary name, then was renamed
            assert sorted(renames[:-1]) == sorted(str(tag_dir / f.path) for f in files)
        assert [m.tag for m in await backend.manifests()] == ["checkpoint-7"]

        dest = tmp_path / "restore"
        moved: list[int] = []
        hashes = await backend.download(manifest, dest, moved.append)
        verify(manifest, {p: ((dest / p).stat().st_size, h) for p, h in hashes.items()})
        assert {f.path: (dest / f.path).read_bytes() for f in files} == CONTENTS
        assert sum(moved) == sum(len(v) for v in CONTENTS.values())

        before = len(sshd.sftp_operations())
        await backend.delete("checkpoint-7")
        removals = [op for op in sshd.sftp_operations()[before:] if op.startswith("remove")]
        assert removals[0] == f'remove name "{tag_dir / MANIFEST_NAME}"'
        assert removals[-1] == f'remove name "{tag_dir / CLAIM_NAME}"'  # claims go last
        assert sorted(removals[1:-1]) == sorted(f'remove name "{tag_dir / f.path}"'
                                                for f in files)
        assert not tag_dir.exists()
        assert await backend.manifests() == []
        await backend.delete("checkpoint-7")  # deleting again is not an error


async def test_uncommitted_upload_is_not_listed(
    sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint, journal: Any,
) -> None:
    """Files without a manifest are an interrupted upload, never a checkpoint."""
    from traind.checkpoints.state.journal import JournalSession

    backend = make_backend(sshd)
    root, files = checkpoint("checkpoint-1", {"a.bin": b"x" * 1000})
    await journal.staged("checkpoint-1", 1, root, files)
    async with asyncio.timeout(20):
        session = JournalSession(journal, "checkpoint-1", lambda n: None)
        await backend.upload("checkpoint-1", root, files, session)
        assert await backend.manifests() == []


async def test_a_malformed_manifest_is_left_out_and_named(
    sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint, store: Store,
    remote: Path,
) -> None:
    """One damaged manifest does not hide the other checkpoints; the error names its path."""
    backend = make_backend(sshd)
    root, files = checkpoint("checkpoint-2", {"weights.bin": b"w" * 1000})
    broken = remote / "store" / "run1" / "checkpoint-1" / MANIFEST_NAME
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            await store(backend, "checkpoint-2", root, files)
            broken.parent.mkdir(parents=True)
            broken.write_text('{"version": 1}')
            assert [m.tag for m in await backend.manifests()] == ["checkpoint-2"]
    [error] = [e for e in logs if e["event"] == "manifest_unreadable"]
    assert error["where"].endswith(f"store/run1/checkpoint-1/{MANIFEST_NAME}")
    assert error["where"].startswith("127.0.0.1:")


async def test_corrupted_remote_file_fails_verification(
    sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint, store: Store,
    remote: Path, tmp_path: Path,
) -> None:
    """A download returns the hash of what arrived, so a damaged remote file is caught."""
    backend = make_backend(sshd)
    root, files = checkpoint("checkpoint-2", {"weights.bin": os.urandom(100_000)})
    async with asyncio.timeout(20):
        manifest = await store(backend, "checkpoint-2", root, files)
        stored = remote / "store" / "run1" / "checkpoint-2" / "weights.bin"
        data = bytearray(stored.read_bytes())
        data[5000] ^= 0xFF
        stored.write_bytes(bytes(data))
        dest = tmp_path / "restore"
        hashes = await backend.download(manifest, dest, lambda n: None)
    with pytest.raises(IntegrityError, match=r"weights\.bin: sha256"):
        verify(manifest, {p: ((dest / p).stat().st_size, h) for p, h in hashes.items()})


async def test_rsync_reports_progress_while_it_runs(
    sshd: SSHServer, make_store: Callable[..., Any], checkpoint: Checkpoint
) -> None:
    """In rsync mode bytes are reported as rsync sends them (its first report comes before
    the file is whole), and add up to the file's size."""
    objects = make_store(sshd, transfer="rsync")
    size = 8 * 1024 * 1024
    root, files = checkpoint("checkpoint-2", {"big.bin": os.urandom(size)})
    session = RecordingSession()
    async with asyncio.timeout(60):
        await objects.send("checkpoint-2/", root, files, session)
    assert 0 < session.advances[0][0] < size
    assert session.advances[0][1] == 0  # reported before the file was done
    assert sum(n for n, _ in session.advances) == size
    assert set(session.done) == {"big.bin"}

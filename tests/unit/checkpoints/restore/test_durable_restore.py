"""A restore's files are made durable before it is published: every file fsynced, and
every directory of the checkpoint, the top one included, and none outside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from traind.checkpoints.restore import download


def test_make_durable_fsyncs_every_file_and_every_directory_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each restored file is fsynced once, each directory holding one (and the root) once."""
    root = tmp_path / "restoring"
    paths = ["top.bin", "a/one.bin", "a/b/two.bin", "a/b/three.bin", "c/d/e/four.bin"]
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_bytes(p.encode())
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    dirs: list[Path] = []
    monkeypatch.setattr(download.os, "fsync", fsync)
    monkeypatch.setattr(download, "fsync_dir", dirs.append)

    download._make_durable(root, paths)

    assert sorted(synced) == sorted(str(root / p) for p in paths)
    assert sorted(dirs) == sorted(root / d for d in ["", "a", "a/b", "c", "c/d", "c/d/e"])

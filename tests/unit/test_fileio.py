"""fileio: disk space reserved before a file is written, and copies hashed as they go."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from traind.storage.fileio import copy_hashed, preallocate


def test_preallocate_reserves_without_growing_the_file(tmp_path: Path) -> None:
    """The blocks are reserved; the file's size stays what was written."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        preallocate(fd, 8 * 1024 * 1024)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    assert st.st_size == 0
    assert st.st_blocks * 512 >= 8 * 1024 * 1024


def test_preallocate_fails_up_front_when_the_disk_cannot_hold_it(tmp_path: Path) -> None:
    """A file larger than the filesystem fails before a byte is written (ENOSPC/EFBIG)."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match=r"No space left|too large"):
            preallocate(fd, 1 << 50)
    finally:
        os.close(fd)


def test_copy_hashed_copies_every_byte(tmp_path: Path) -> None:
    """The copy is byte-identical and the hash is the source's."""
    data = os.urandom(5 * 1024 * 1024 + 7)
    (tmp_path / "src").write_bytes(data)
    seen: list[int] = []
    size, sha = copy_hashed(tmp_path / "src", tmp_path / "dst", seen.append)
    assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest())
    assert (tmp_path / "dst").read_bytes() == data
    assert sum(seen) == len(data)

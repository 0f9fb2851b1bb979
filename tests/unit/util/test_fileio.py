"""fileio: disk space reserved before a file is written, direct writes on local disks only,
and copies hashed as they go."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from traind.util import fileio
from traind.util.fileio import copy_hashed, direct_io, preallocate


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


def test_direct_io_only_on_local_block_filesystems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ext4/xfs/btrfs files are switched to O_DIRECT; a network filesystem's stay buffered."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        local = fileio._filesystem(fd) in fileio._DIRECT_FILESYSTEMS
        assert fileio._filesystem(fd) != 0
        assert direct_io(fd) == local
        assert bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT) == local
        assert not direct_io(fd, False)
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
        monkeypatch.setattr(fileio, "_filesystem", lambda fd: 0x6969)  # NFS
        assert not direct_io(fd)
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [0, 100, fileio.CHUNK, 2 * fileio.CHUNK + 4097])
def test_copy_hashed_sizes_around_chunks_and_blocks(tmp_path: Path, size: int) -> None:
    """Direct writes of whole chunks and a padded tail leave exactly the source's bytes."""
    data = os.urandom(size)
    (tmp_path / "src").write_bytes(data)
    seen: list[int] = []
    total, digest = copy_hashed(tmp_path / "src", tmp_path / "dst", seen.append, durable=False)
    assert (total, digest) == (size, hashlib.sha256(data).hexdigest())
    assert sum(seen) == size
    assert (tmp_path / "dst").read_bytes() == data


def test_staged_writer_appends_pieces_of_any_size(tmp_path: Path) -> None:
    """Pieces that straddle stage boundaries land in order; the padded tail is cut."""
    data = os.urandom(2 * fileio.STAGE + 12345)
    out = fileio.StagedWriter(fileio.create(tmp_path / "f", len(data)))
    try:
        for start in range(0, len(data), 1_000_003):
            out.write(data[start : start + 1_000_003])
        out.finish(len(data))
    finally:
        out.close()
    assert (tmp_path / "f").read_bytes() == data


def test_shared_fd_is_closed_by_its_last_user(tmp_path: Path) -> None:
    """Closed by the owner when nobody uses it, else when the last using block ends; no
    block starts once the owner let go."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    shared = fileio.SharedFd(fd)
    with shared.using() as inside:
        shared.close()
        shared.close()
        os.fstat(inside)  # still open
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
    with pytest.raises(OSError, match="abandoned"), shared.using():
        pass


def test_write_atomic_replaces_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    """``write_atomic`` creates the directory, replaces what was there with the new bytes
    and leaves no ``.traind-part`` file behind."""
    target = tmp_path / "a" / "b" / "claim.json"
    fileio.write_atomic(target, b"old")
    fileio.write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(target.parent) == ["claim.json"]


def test_temporary_names_for_linking_are_never_shared() -> None:
    """Two exclusive creates of one name, from the same thread or from hosts whose pids
    agree, write under temporary names of their own."""
    names = {fileio.unique_temporary_name("dir/traind-writer.json") for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith("dir/traind-writer.json.") and n.endswith(fileio.PART_SUFFIX)
               for n in names)
    assert fileio.temporary_name("dir/x") == "dir/x" + fileio.PART_SUFFIX

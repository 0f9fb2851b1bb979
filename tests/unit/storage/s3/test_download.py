"""s3_download.Assembler: ranges written in any order, with direct I/O where the filesystem
takes it, hashed in order from memory, and the padded tail of a direct write cut off."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from traind.errors import IntegrityError
from traind.storage.s3 import download as s3_download
from traind.storage.s3.download import Assembler
from traind.util import fileio
from traind.util.fileio import ALIGN, create

RANGE = 16 * ALIGN


def ranges(data: bytes) -> list[tuple[int, mmap.mmap, int]]:
    """(offset, page-aligned buffer holding the range, length) for each range of ``data``."""
    out = []
    for start in range(0, len(data), RANGE):
        piece = data[start : start + RANGE]
        buf = mmap.mmap(-1, RANGE)
        buf[: len(piece)] = piece
        out.append((start, buf, len(piece)))
    return out


def test_ranges_in_any_order_are_written_and_hashed_in_order(tmp_path: Path) -> None:
    """A range is hashed only once every earlier one has been; whoever completes the gap
    hashes what follows it and hands those buffers back. The file ends at its size even
    though the unaligned tail was written padded."""
    data = os.urandom(3 * RANGE + 1000)
    parts = ranges(data)
    fd = create(tmp_path / "f", len(data))
    try:
        asm = Assembler(fd, len(data))
        assert asm.direct == (fileio._filesystem(fd) in fileio._DIRECT_FILESYSTEMS)
        order = [2, 0, 3, 1]
        freed = [asm.put(*parts[i]) for i in order]
        with pytest.raises(IntegrityError):
            Assembler(fd, len(data) + 1).finish()
        assert asm.finish() == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
    bufs = [buf for _, buf, _ in parts]
    assert freed == [[], [bufs[0]], [], [bufs[1], bufs[2], bufs[3]]]
    assert (tmp_path / "f").read_bytes() == data


def test_concurrent_puts_hash_every_byte_once(tmp_path: Path) -> None:
    """Ranges put from several threads in a shuffled order: the hash is the file's, and
    every buffer comes back exactly once."""
    data = os.urandom(40 * RANGE + 5)
    parts = ranges(data)
    random.Random(3).shuffle(parts)
    fd = create(tmp_path / "f", len(data))
    try:
        asm = Assembler(fd, len(data))
        with ThreadPoolExecutor(4) as pool:
            freed = [buf for got in pool.map(lambda p: asm.put(*p), parts) for buf in got]
        digest = asm.finish()
    finally:
        os.close(fd)
    assert digest == hashlib.sha256(data).hexdigest()
    assert sorted(map(id, freed)) == sorted(id(buf) for _, buf, _ in parts)
    assert (tmp_path / "f").read_bytes() == data


def test_a_refused_direct_write_falls_back_to_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that takes O_DIRECT at open but refuses the write (stricter alignment)
    gets the bytes buffered instead, exactly as many as the file has."""
    data = os.urandom(2 * RANGE + 10)
    real = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, buf: memoryview, offset: int) -> int:
        if not refused:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buf, offset)

    monkeypatch.setattr(fileio.os, "pwrite", pwrite)
    monkeypatch.setattr(fileio, "direct_io", lambda fd, on=True: on)
    fd = create(tmp_path / "f", len(data))
    try:
        asm = Assembler(fd, len(data))
        for part in ranges(data)[::-1]:
            asm.put(*part)
        assert not asm.direct
        assert asm.finish() == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
    assert refused
    assert (tmp_path / "f").read_bytes() == data


def test_the_descriptor_outlives_a_put_still_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled restore closes the file while a worker thread may still be writing: the
    descriptor stays open until that write ends (never reused under it), and later puts
    are refused."""
    data = os.urandom(RANGE)
    (part,) = ranges(data)
    entered, release = threading.Event(), threading.Event()
    real = s3_download.write_at

    def slow(*args: object, **kwargs: object) -> bool:
        entered.set()
        release.wait(10)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(s3_download, "write_at", slow)
    fd = create(tmp_path / "f", len(data))
    asm = Assembler(fd, len(data))
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(asm.put, *part)
        assert entered.wait(10)
        asm.close()
        asm.close()  # idempotent
        os.fstat(fd)  # still open: the put is using it
        release.set()
        assert running.result(10) == [part[1]]
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
    with pytest.raises(OSError, match="abandoned"):
        asm.put(*part)
    assert (tmp_path / "f").read_bytes()[: len(data)] == data

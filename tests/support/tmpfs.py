"""A real, size-limited tmpfs for full-disk tests (root only), unmounted even on failure."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support.requires import missing


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``mount -o size=``: ``"12m"``) on ``path`` for the block;
    skip with a reason when not root (fail under CI)."""
    if os.geteuid() != 0:
        missing("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


def fill(directory: Path, leave: int = 0) -> Path:
    """Write a ballast file in ``directory`` until its filesystem has at most ``leave``
    bytes free; return the ballast (delete it to give the space back)."""
    ballast = directory / "ballast"
    chunk = b"\0" * 65536
    with open(ballast, "wb", buffering=0) as f:
        try:
            while True:
                st = os.statvfs(directory)
                left = st.f_bavail * st.f_frsize - leave
                if left <= 0:
                    break
                f.write(chunk[: min(len(chunk), left)])
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return ballast


def remount(path: Path, mode: str) -> None:
    """Remount the tmpfs on ``path`` ``"ro"`` (every write fails: a store that is down) or
    ``"rw"``."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, timeout=30)

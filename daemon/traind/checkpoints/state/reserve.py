"""The journal's reserve: space set aside in state_dir so a full disk never stops the daemon
from recording, dropping or committing.

A file of ``RESERVE_BYTES`` is kept next to the journal. A journal write that fails for lack
of space deletes it and tries again at once, so the write that lets a snapshot go (or a
commit) is made with the room it left; it is made again once the disk has room to spare.
``worth_arming`` is the decision; ``Reserve`` does the file I/O, blocking.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from traind.util import fileio

log = structlog.get_logger("traind.journal")

RESERVE_BYTES = 1024 * 1024
"""Enough for hundreds of journal transactions (a few pages each)."""
SHARE = 64
"""On a small filesystem the reserve is at most this fraction of it."""
ROOM_FACTOR = 4
"""The reserve is made again only with this many times its size free: never from the last
bytes the trainer needs."""


def worth_arming(free: int, size: int) -> bool:
    """Whether a reserve of ``size`` bytes may be taken from ``free``."""
    return free >= ROOM_FACTOR * size


def reserve_size(total: int, most: int = RESERVE_BYTES) -> int:
    """The reserve on a filesystem of ``total`` bytes: ``most``, or a ``SHARE`` of a small
    one, whole 4 KiB pages."""
    return max(4096, min(most, total // SHARE) // 4096 * 4096)


class Reserve:
    """``path``, a file of real blocks (``reserve_size`` of its filesystem), while armed."""

    def __init__(self, path: Path, most: int = RESERVE_BYTES) -> None:
        self.path = path
        self._most = most
        self.size = 0
        """The bytes it held when last armed (0: never)."""
        self.spent = False
        """Whether it was given to the journal (or could not be made) and is to be made again."""

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> Reserve:
        """The journal's reserve in ``state_dir``."""
        return cls(state_dir / "journal.reserve")

    @property
    def armed(self) -> bool:
        """Whether the reserve file is there."""
        return self.path.exists()

    def arm(self) -> bool:
        """Make the reserve when the disk has room to spare; return whether it is there."""
        if self.armed:
            return True
        try:
            st = os.statvfs(self.path.parent)
            size = reserve_size(st.f_blocks * st.f_frsize, self._most)
            if not worth_arming(st.f_bavail * st.f_frsize, size):
                return False
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = fileio.create(tmp, size)
            try:
                fileio.write_all(fd, bytes(size))  # real blocks, preallocated or not
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
            self.size = size
        except OSError:
            self.path.with_name(self.path.name + ".tmp").unlink(missing_ok=True)
            return False
        return True

    def release(self) -> bool:
        """Delete the reserve, giving its space to the journal; return whether there was
        one to give."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    async def give(self, journal: Path) -> bool:
        """Give the reserve's space to the journal at ``journal`` (a write failed for lack of
        it); return whether there was any to give."""
        if not await asyncio.to_thread(self.release):
            return False
        self.spent = True
        log.warning("journal_reserve_released", journal=str(journal), bytes=self.size,
                    free_bytes=free_bytes_known(journal.parent),
                    hint="the disk is full; made again once it has room")
        return True

    async def take_back(self, journal: Path) -> None:
        """Make the reserve again, once spent, when the disk has room to spare."""
        if self.spent and await asyncio.to_thread(self.arm):
            self.spent = False
            log.info("journal_reserve_restored", journal=str(journal), bytes=self.size)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer (the trainer) can still use on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_bytes_known(path: Path) -> int | None:
    """``free_bytes``, or None when the filesystem cannot be asked (for a log line)."""
    try:
        return free_bytes(path)
    except OSError:
        return None

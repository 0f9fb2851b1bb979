"""run.state_dir while a daemon holds it: the lock that keeps a second daemon off it, the
run's journal, and the snapshots let go to open that journal on a full disk."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.checkpoints.state.space import Pinned, open_journal
from traind.errors import TraindError

log = structlog.get_logger("traind.app")


@dataclass(frozen=True)
class StateDir:
    """What a daemon holds of run.state_dir while it runs: the lock that keeps a second
    daemon off it, the run's journal, and the snapshots let go to open that journal at all
    (a full disk; the daemon journals them as dropped)."""

    lock: int | None
    journal: Journal
    dropped: list[Pinned]

    @classmethod
    def open(cls, state_dir: Path, run: RunIdentity) -> StateDir:
        """Make ``state_dir``, lock it (TraindError when another daemon holds it) and open
        ``run``'s journal in it. Blocking."""
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_state_dir(state_dir)
        try:
            journal, dropped = open_journal(state_dir, run)
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise
        return cls(lock, journal, dropped)

    def close(self) -> None:
        """Close the journal, then let go of the lock."""
        self.journal.close()
        if self.lock is not None:
            os.close(self.lock)


def lock_state_dir(state_dir: Path) -> int | None:
    """Hold ``state_dir/traind.lock`` for this daemon's life (its descriptor; released by
    the kernel however the process ends). A second daemon of the same state_dir would share
    its journal and staging, and stop its children as leftovers: it is refused instead.
    None where the filesystem has no locks (a warning says so)."""
    fd = os.open(state_dir / "traind.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise TraindError(
            f"another traind (pid {holder}) is running with run.state_dir {state_dir}; stop "
            "it first, or give this one a state_dir of its own"
        ) from None
    except OSError as exc:
        os.close(fd)
        log.warning("state_dir_unlocked", state_dir=str(state_dir), error=str(exc),
                    hint="two daemons on this state_dir would not be noticed")
        return None
    os.ftruncate(fd, 0)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as exc:  # a full disk: the lock holds all the same, only unnamed
        log.warning("state_dir_lock_pid_unwritten", state_dir=str(state_dir), error=str(exc))
    return fd

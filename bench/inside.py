"""What a running daemon spends on one transfer, measured inside a bench's traind child.

The child wraps its transfer in ``recorded(path)``; the bench reads ``path`` back and
replaces the child's whole-process wall and CPU time with it, the difference being
interpreter start-up and imports, paid once per daemon. The transfer runs with the daemon's
own upload session (``journal_session``): resume state goes to a real journal, as it would.
"""

from __future__ import annotations

import contextlib
import json
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal, JournalSession


def cpu_now() -> float:
    """CPU seconds of this process (all threads) and its waited-for children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def recorded(path: Path) -> Iterator[None]:
    """Write the block's wall and CPU seconds to ``path`` as JSON, if it completes."""
    started, cpu = time.monotonic(), cpu_now()
    yield
    path.write_text(json.dumps({"seconds": time.monotonic() - started, "cpu": cpu_now() - cpu}))


def read(path: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) that ``recorded`` wrote to ``path``."""
    inside = json.loads(path.read_text())
    return float(inside["seconds"]), float(inside["cpu"])


class _Session(JournalSession):
    """The daemon's session, also keeping each stored file's sha256 for the manifest."""

    def __init__(self, journal: Journal, tag: str) -> None:
        super().__init__(journal, tag, lambda nbytes: None)
        self.done: dict[str, str] = {}

    async def file_done(self, path: str, sha256: str) -> None:
        self.done[path] = sha256
        await super().file_done(path, sha256)


@contextlib.contextmanager
def journal_session(tag: str) -> Iterator[_Session]:
    """The upload session a daemon gives a backend for ``tag``, over a journal in a new
    temporary directory (removed afterwards); ``.done`` maps each stored file to its sha256."""
    with tempfile.TemporaryDirectory(prefix="traind-bench-state-") as state:
        journal = Journal.in_state_dir(Path(state), RunIdentity("bench", Path(state), "bench"))
        try:
            yield _Session(journal, tag)
        finally:
            journal.close()

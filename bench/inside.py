"""What a running daemon spends on one transfer, measured inside a bench's traind child.

The child wraps its transfer in ``recorded(path)``; the bench reads ``path`` back and
replaces the child's whole-process wall and CPU time with it, the difference being
interpreter start-up and imports, paid once per daemon.
"""

from __future__ import annotations

import contextlib
import json
import resource
import time
from collections.abc import Iterator
from pathlib import Path


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

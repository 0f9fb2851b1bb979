"""Which run a journal's records and staging snapshots belong to.

One ``state_dir`` (default ``/var/lib/traind``) is shared by every run on a host, one after
another, so each record is kept under its run's key: its name and output_dir. The store is
deliberately not part of the key: a reload may switch the store in the middle of a run, and
each record keeps the store it went to (the journal's ``backend``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from traind.config import Settings


@dataclass(frozen=True)
class RunIdentity:
    """A run: its ``name`` and resolved ``output_dir``."""

    name: str
    output_dir: Path

    @classmethod
    def of(cls, settings: Settings) -> RunIdentity:
        """The run ``settings`` describe."""
        return cls(settings.run.name, Path(os.path.realpath(settings.run.output_dir)))

    @property
    def key(self) -> str:
        """``<name>-<12 hex digits>``: a file name telling runs apart, readable by people."""
        digest = hashlib.sha256(f"{self.name}\0{self.output_dir}".encode()).hexdigest()
        return f"{self.name}-{digest[:12]}"


def staging_dir(state_dir: Path, run: RunIdentity) -> Path:
    """Where the snapshots of ``run``'s checkpoints are staged."""
    return state_dir / "staging" / run.key


def ack_dir(state_dir: Path, run: RunIdentity) -> Path:
    """Where ``run``'s trainer is told a checkpoint is snapshot (see ``ACK_DIR_ENV``)."""
    return state_dir / "acks" / run.key

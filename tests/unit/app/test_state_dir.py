"""run.state_dir is one daemon's: a second one on it is refused, naming the first's pid."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from traind.app.state_dir import StateDir
from traind.checkpoints.state.identity import RunIdentity
from traind.errors import TraindError


def test_a_second_daemon_on_one_state_dir_is_refused(tmp_path: Path) -> None:
    """The lock is held until close; meanwhile a second open says whose it is."""
    run = RunIdentity("run-a", tmp_path / "out")
    first = StateDir.open(tmp_path / "state", run)
    try:
        with pytest.raises(TraindError, match=re.escape(f"another traind (pid {os.getpid()})")):
            StateDir.open(tmp_path / "state", run)
    finally:
        first.close()
    StateDir.open(tmp_path / "state", run).close()  # let go: the next one takes it

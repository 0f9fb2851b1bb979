"""A snapshot that fails for a passing reason (here the staging area cannot be created, as
on a full disk) is retried, never given up: the checkpoint is committed once the cause is gone."""

from __future__ import annotations

from pathlib import Path

from tests.support.checkpoints import setup, stored, write_checkpoint
from tests.support.daemon import DaemonProcess


def test_failed_snapshot_is_retried(tmp_path: Path) -> None:
    """checkpoint_snapshot_failed is logged once, and the checkpoint still gets committed."""
    out, store, cfg = setup(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / "staging").write_text("a file where the staging directory belongs")
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        write_checkpoint(out, 1)
        daemon.wait_for("checkpoint_snapshot_failed", timeout=20)
        (state / "staging").unlink()
        daemon.wait_for("checkpoint_committed", timeout=30)
        assert len(daemon.named("checkpoint_snapshot_failed")) == 1
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == ["checkpoint-1"]

"""SIGHUP reload of a running daemon: storage switch applies live, a broken file changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.checkpoints import setup, stored, write_checkpoint
from tests.support.daemon import DaemonProcess, is_event


def committed(daemon: DaemonProcess, tag: str) -> None:
    daemon.wait_for(is_event("checkpoint_committed", tag=tag), timeout=30)


def test_switch_store_by_sighup(tmp_path: Path) -> None:
    """After editing storage.path and SIGHUP, new checkpoints go to the new store, old stay."""
    out, store, cfg = setup(tmp_path)
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        write_checkpoint(out, 1)
        committed(daemon, "checkpoint-1")
        new_store = tmp_path / "store2"
        cfg.write_text(cfg.read_text().replace(f'path = "{store}"', f'path = "{new_store}"'))
        daemon.proc.send_signal(signal.SIGHUP)
        applied = daemon.wait_for("reload_applied", timeout=20)
        assert applied["applied"] == ["storage"]
        write_checkpoint(out, 2)
        committed(daemon, "checkpoint-2")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == ["checkpoint-1"]
    assert sorted(stored(new_store, "exp")) == ["checkpoint-2"]
    assert len(daemon.named("checkpoint_committed")) == 2


def test_broken_file_changes_nothing(tmp_path: Path) -> None:
    """A broken TOML sent by SIGHUP is rejected with every problem; the daemon carries on."""
    out, store, cfg = setup(tmp_path)
    good = cfg.read_text()
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        cfg.write_text(good.replace("keep_last = 100", "keep_last = -1\nkeep_lats = 2"))
        daemon.proc.send_signal(signal.SIGHUP)
        rejected = daemon.wait_for("reload_rejected", timeout=20)
        assert any("retention.keep_last = -1" in p for p in rejected["problems"])
        assert any("retention.keep_lats: unknown key" in p for p in rejected["problems"])
        write_checkpoint(out, 1)
        committed(daemon, "checkpoint-1")
        cfg.write_text(good.replace("[checkpoints]", '[checkpoints]\npattern = "ckpt-*"'))
        daemon.proc.send_signal(signal.SIGHUP)
        applied = daemon.wait_for("reload_needs_restart", timeout=20)
        assert applied["sections"] == ["checkpoints"]
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == ["checkpoint-1"]


def test_non_utf8_file_changes_nothing(tmp_path: Path) -> None:
    """A file that is not UTF-8, sent by SIGHUP, is rejected like any invalid file: the
    daemon and its trainer carry on."""
    out, store, cfg = setup(tmp_path, extra='[trainer]\ncommand = ["sleep", "300"]')
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("child_started", timeout=20)
        cfg.write_bytes(cfg.read_bytes() + b"\n# caf\xe9\n")
        daemon.proc.send_signal(signal.SIGHUP)
        rejected = daemon.wait_for("reload_rejected", timeout=20)
        assert rejected["problems"][0].startswith("not UTF-8 text")
        write_checkpoint(out, 1)
        committed(daemon, "checkpoint-1")
        assert daemon.named("child_exited") == []
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == ["checkpoint-1"]

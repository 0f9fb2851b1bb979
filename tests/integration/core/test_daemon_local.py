"""``traind run`` end to end with the local store: the real CLI, real files, real signals."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.checkpoints import setup, stored, write_checkpoint
from tests.support.daemon import DaemonProcess, is_event


def test_every_checkpoint_committed_despite_fast_rotation(tmp_path: Path) -> None:
    """Checkpoints the trainer deletes milliseconds after the next save are still committed."""
    out, store, cfg = setup(tmp_path)
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        expected = {}
        for step in range(1, 7):
            expected[f"checkpoint-{step}"] = write_checkpoint(out, step)
            if step > 2:  # save_total_limit=2: rotate right after saving
                shutil.rmtree(out / f"checkpoint-{step - 2}")
            time.sleep(0.15)
        for tag in expected:
            daemon.wait_for(is_event("checkpoint_committed", tag=tag), timeout=30)
        assert stored(store, "exp") == expected
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    staged = [e for e in daemon.named("checkpoint_staged")]
    assert max(e["since_last_write"] for e in staged) < 1.0  # detected well within a second


def test_restores_newest_on_fresh_host_then_streams(tmp_path: Path) -> None:
    """A fresh output_dir gets the newest committed checkpoint before anything else."""
    out, _store, cfg = setup(tmp_path)
    first = DaemonProcess(cfg)
    try:
        for step in (1, 2):
            write_checkpoint(out, step)
        first.wait_for(is_event("checkpoint_committed", tag="checkpoint-2"), timeout=30)
        assert first.stop() == 0
    finally:
        first.kill()
    shutil.rmtree(out)
    shutil.rmtree(tmp_path / "state")  # a new host: no journal either
    second = DaemonProcess(cfg)
    try:
        restored = second.wait_for("checkpoint_restored", timeout=30)
        assert restored["tag"] == "checkpoint-2"
        second.wait_for("daemon_ready", timeout=10)
        assert (out / "checkpoint-2/trainer_state.json").exists()
        assert not (out / "checkpoint-1").exists()
        write_checkpoint(out, 3)
        second.wait_for(is_event("checkpoint_committed", tag="checkpoint-3"), timeout=30)
        assert second.stop() == 0
    finally:
        second.kill()
    assert not [e for e in second.named("checkpoint_committed") if e["tag"] == "checkpoint-2"]


def test_sigkill_mid_commit_then_restart_commits_once(tmp_path: Path) -> None:
    """SIGKILL while a checkpoint is half stored; the restarted daemon finishes it once."""
    out, store, cfg = setup(tmp_path, storage_extra="concurrency = 1")
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        expected = write_checkpoint(out, 1, size=8 * 1024 * 1024, nfiles=12)
        target = store / "exp/checkpoint-1"
        deadline = time.monotonic() + 30
        # concurrency = 1: a second stored file means the first is journalled as done.
        while sum(p.suffix == ".bin" for p in target.glob("*")) < 2:
            assert time.monotonic() < deadline, "upload never started"
            time.sleep(0.001)
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(timeout=10)
    finally:
        daemon.kill()
    assert not (target / "traind-manifest.json").exists(), "killed too late to test anything"
    assert daemon.named("checkpoint_committed") == []
    restarted = DaemonProcess(cfg)
    try:
        restarted.wait_for("recovered_upload", timeout=20)
        done = restarted.wait_for("checkpoint_committed", timeout=60)
        assert done["sent_bytes"] < done["bytes"], "finished files were sent again"
        time.sleep(1.5)  # a second, duplicate commit would show up by now
        assert restarted.stop() == 0
    finally:
        restarted.kill()
    assert len(restarted.named("checkpoint_committed")) == 1
    assert stored(store, "exp") == {"checkpoint-1": expected}
    assert not list(store.rglob("*.traind-part"))
    assert not list((tmp_path / "state/staging").glob("*/*")), "a snapshot left in staging"


def test_retention_prunes_store_and_output_dir(tmp_path: Path) -> None:
    """After commits, the store keeps keep_last and output_dir keeps keep_local."""
    out, store, cfg = setup(tmp_path)
    cfg.write_text(
        cfg.read_text()
        .replace("keep_last = 100", "keep_last = 2")
        .replace("keep_local = 100", "keep_local = 1")
    )
    daemon = DaemonProcess(cfg)
    try:
        for step in (1, 2, 3, 4):
            write_checkpoint(out, step)
        for where, tag in (("remote", "checkpoint-2"), ("local", "checkpoint-3")):
            daemon.wait_for(is_event("checkpoint_pruned", where=where, tag=tag), timeout=30)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == ["checkpoint-3", "checkpoint-4"]
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-4"]


def test_local_retention_spares_the_trainers_resume_point(tmp_path: Path) -> None:
    """With keep_local = 1, the checkpoint the trainer resumed from stays on disk while the
    trainer runs (it may still be loading it), though newer ones are committed."""
    out, _, cfg = setup(tmp_path)
    cfg.write_text(cfg.read_text().replace("keep_local = 100", "keep_local = 1"))
    daemon = DaemonProcess(cfg)  # a first daemon, without a trainer, commits -1 and -2
    try:
        write_checkpoint(out, 1)
        daemon.wait_for("checkpoint_committed", timeout=30)
        write_checkpoint(out, 2)
        daemon.wait_for(lambda e: e.get("event") == "checkpoint_committed"
                        and e["tag"] == "checkpoint-2", timeout=30)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    script = (
        "import os, sys, time\n"
        "for step in (3, 4):\n"
        f"    d = os.path.join({str(out)!r}, f'checkpoint-{{step}}'); os.makedirs(d)\n"
        "    open(os.path.join(d, 'w.bin'), 'wb').write(os.urandom(1000))\n"
        "    open(os.path.join(d, 'trainer_state.json'), 'w').write('{}')\n"
        "    time.sleep(0.3)\n"
        "print('resumed from', sys.argv[1], flush=True); time.sleep(600)\n"
    )
    argv = [sys.executable, "-c", script, "{resume_from}"]
    cfg.write_text(cfg.read_text() + f"[trainer]\ncommand = {json.dumps(argv)}\n")
    daemon = DaemonProcess(cfg)
    try:
        line = daemon.wait_for(lambda e: "resumed from" in str(e.get("line", "")), timeout=30)
        daemon.wait_for(lambda e: e.get("event") == "checkpoint_pruned"
                        and e["tag"] == "checkpoint-3", timeout=60)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert line["line"] == f"resumed from {out / 'checkpoint-2'}"
    pruned = {e["tag"] for e in daemon.named("checkpoint_pruned") if e["where"] == "local"}
    assert pruned <= {"checkpoint-1", "checkpoint-3"}  # -1 perhaps under the first daemon
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_a_second_daemon_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    """Two daemons would share one journal and stop each other's children: the second one
    exits at once, naming the first one's pid; the first keeps running."""
    out, _, cfg = setup(tmp_path)
    first = DaemonProcess(cfg)
    try:
        first.wait_for("daemon_ready", timeout=20)
        second = subprocess.run(
            [sys.executable, "-m", "traind", "run", "-c", str(cfg)],
            capture_output=True, text=True, timeout=60,
        )
        assert second.returncode == 1
        assert f"another traind (pid {first.proc.pid}) is running" in second.stderr
        assert "Traceback" not in second.stderr
        write_checkpoint(out, 1)
        first.wait_for("checkpoint_committed", timeout=30)
        assert first.stop() == 0
    finally:
        first.kill()


def test_sigterm_and_sigint_exit_zero_promptly(tmp_path: Path) -> None:
    """Both stop signals end the daemon with exit code 0 within seconds."""
    _, _, cfg = setup(tmp_path)
    for sig in (signal.SIGTERM, signal.SIGINT):
        daemon = DaemonProcess(cfg)
        try:
            daemon.wait_for("daemon_ready", timeout=20)
            started = time.monotonic()
            assert daemon.stop(sig, timeout=15) == 0
            assert time.monotonic() - started < 5
            daemon.wait_for("daemon_stopped", timeout=5)
        finally:
            daemon.kill()

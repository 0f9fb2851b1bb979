"""A real tiny TRL training run streamed by ``traind run``: committed, pruned, resumable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import DaemonProcess, is_event, write_config
from tests.support.requires import need_module
from tests.support.tiny_train import QUIET_ENV, train_command


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_trl_run_streamed_pruned_and_resumable(tmp_path: Path) -> None:
    """Every checkpoint of a real TRL run (rotating its own) is committed with matching
    hashes, retention keeps what the policy says, and a pulled checkpoint resumes training."""
    need_module("trl")
    out, store = tmp_path / "out", tmp_path / "store"
    cfg = write_config(
        tmp_path / "traind.toml",
        run="trl",
        output_dir=out,
        state_dir=tmp_path / "state",
        storage=f'type = "local"\npath = "{store}"',
    )
    cfg.write_text(
        cfg.read_text().replace("keep_last = 100", "keep_last = 2\nkeep_every_steps = 4")
    )
    env = {**os.environ, **QUIET_ENV}
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=30)
        trained = subprocess.run(
            train_command(out, max_steps=6, save_steps=1, save_total_limit=2),
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert trained.returncode == 0, trained.stderr[-2000:]
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-5", "checkpoint-6"]
        for step in range(1, 7):
            daemon.wait_for(is_event("checkpoint_committed", step=step), timeout=60)
        daemon.wait_for(
            lambda e: e.get("event") == "checkpoint_pruned" and e["tag"] == "checkpoint-3",
            timeout=30,
        )
        local_hashes = {
            p.relative_to(out / "checkpoint-6").as_posix(): sha(p)
            for p in (out / "checkpoint-6").rglob("*")
            if p.is_file()
        }
        assert daemon.stop() == 0
    finally:
        daemon.kill()

    committed = {e["step"] for e in daemon.named("checkpoint_committed")}
    assert committed == set(range(1, 7))
    remaining = sorted(p.parent.name for p in (store / "trl").glob("*/traind-manifest.json"))
    assert remaining == ["checkpoint-4", "checkpoint-5", "checkpoint-6"]  # last 2 + every 4th
    manifest = json.loads((store / "trl/checkpoint-6/traind-manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == local_hashes
    assert manifest["trainer"]["global_step"] == 6

    restored_parent = tmp_path / "fresh"
    pulled = subprocess.run(
        [sys.executable, "-m", "traind", "pull", "-c", str(cfg), "latest", str(restored_parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pulled.returncode == 0, pulled.stderr
    resumed = subprocess.run(
        train_command(restored_parent, max_steps=8, save_steps=2, resume=True),
        env={**env, "TRAIND_RESUME_FROM": str(restored_parent / "checkpoint-6")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "global_step=8" in resumed.stdout
    state = json.loads((restored_parent / "checkpoint-8/trainer_state.json").read_text())
    assert state["global_step"] == 8
    assert next(h["step"] for h in state["log_history"] if "loss" in h) <= 6  # history kept

"""Switching the store from local to S3 by editing the TOML and sending SIGHUP while a real
training run goes on: every checkpoint is committed exactly once, in one store or the other."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.checkpoints import setup, stored, swap_storage
from tests.support.daemon import DaemonProcess, is_event
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import running_seaweed
from tests.support.tiny_train import QUIET_ENV, train_command


def test_switch_local_to_s3_mid_run(tmp_path: Path) -> None:
    """Checkpoints before the reload land locally, those after in S3; none twice, none lost."""
    need_module("trl")
    need_module("aiobotocore")
    out = tmp_path / "out"
    argv = train_command(out, max_steps=8, save_steps=1, callback=True, step_sleep=0.4)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    trainer = f"[trainer]\ncommand = {json.dumps(argv)}\nenv = {{ {env} }}\n"
    out, local_store, cfg = setup(tmp_path, extra=trainer)
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        daemon = DaemonProcess(cfg)
        try:
            daemon.wait_for(is_event("checkpoint_committed", step=2), timeout=120)
            swap_storage(cfg, server.storage_toml())
            daemon.proc.send_signal(signal.SIGHUP)
            assert daemon.wait_for("reload_applied", timeout=30)["applied"] == ["storage"]
            assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-30:])
        finally:
            daemon.kill()
        committed = [e["tag"] for e in daemon.named("checkpoint_committed")]
        assert sorted(committed) == sorted(f"checkpoint-{n}" for n in range(1, 9))
        in_s3 = json.loads(
            subprocess.run(
                [sys.executable, "-m", "traind", "list", "-c", str(cfg), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
    local = set(stored(local_store, "exp"))
    remote = {r["tag"] for r in in_s3}
    assert local.isdisjoint(remote)
    assert local | remote == set(committed)
    assert {"checkpoint-1", "checkpoint-2"} <= local
    assert "checkpoint-8" in remote

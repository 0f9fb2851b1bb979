"""A child started by the real daemon cannot see traind's configuration, its secrets above all."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.support.checkpoints import setup, write_checkpoint
from tests.support.daemon import DaemonProcess
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import SECRET_KEY, running_seaweed


def test_trainer_does_not_see_the_storage_secret(tmp_path: Path) -> None:
    """The S3 secret given to the daemon as TRAIND_STORAGE__SECRET_ACCESS_KEY (and used: a
    checkpoint is committed with it) is not in the trainer's environment; traind's runtime
    variables are."""
    need_module("aiobotocore")
    dump = tmp_path / "env.json"
    code = (f"import json, os, time; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))"
            "; time.sleep(600)")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        out, _, cfg = setup(
            tmp_path, extra=f"[trainer]\ncommand = {json.dumps([sys.executable, '-c', code])}\n",
            storage=server.storage_toml(secret_access_key=None),  # given by the environment
        )
        daemon = DaemonProcess(cfg, env={"TRAIND_STORAGE__SECRET_ACCESS_KEY": SECRET_KEY})
        try:
            daemon.wait_for("child_started", timeout=60)
            write_checkpoint(out, 1)
            daemon.wait_for("checkpoint_committed", timeout=60)  # the secret works
            deadline = time.monotonic() + 30
            while not dump.exists() or not dump.read_text().endswith("}"):
                assert time.monotonic() < deadline, "the trainer never wrote its environment"
                time.sleep(0.1)
            assert daemon.stop() == 0
        finally:
            daemon.kill()
    env = json.loads(dump.read_text())
    assert "TRAIND_STORAGE__SECRET_ACCESS_KEY" not in env
    assert SECRET_KEY not in env.values()
    assert {"TRAIND_CHILD_ID", "TRAIND_STATE_DIR", "TRAIND_HEARTBEAT"} <= env.keys()

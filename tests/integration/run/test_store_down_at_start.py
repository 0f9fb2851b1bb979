"""``traind run`` started while its S3 store is down, through the real CLI and a real
SeaweedFS brought up later on the same port: the daemon waits (and says so in its logs and
``traind status``) instead of exiting; with a resume point in output_dir the trainer starts
at once and uploads catch up; a store that refuses the bucket or the credentials still ends
the start-up at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.checkpoints import write_checkpoint
from tests.support.daemon import DaemonProcess, Event, is_event, write_config
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import SeaweedS3, running_seaweed

# A trainer that says where it resumes from, saves checkpoint-N+1, then trains on.
TRAINER = """
import json, os, sys, time
out, resume = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
step = int(resume.rsplit("-", 1)[1]) + 1 if resume else 1
print(f"resuming from {resume or 'scratch'}", flush=True)
d = os.path.join(out, f"checkpoint-{step}")
os.makedirs(d)
with open(os.path.join(d, "model.bin"), "wb") as f:
    f.write(os.urandom(1024 * 1024))
with open(os.path.join(d, "trainer_state.json"), "w") as f:
    json.dump({"global_step": step}, f)
time.sleep(600)
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS with bucket ``ckpts``, stopped again: its ports are known and free."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as s3:
        s3.create_bucket("ckpts")
        s3.stop()
        yield s3


def s3_config(tmp_path: Path, server: SeaweedS3, trainer: bool, **storage: str) -> Path:
    """A config streaming to ``server`` (``storage`` overrides keys), optionally with
    TRAINER as the supervised trainer."""
    out = tmp_path / "out"
    section = server.storage_toml(**({"retries": 1, "connect_timeout": "2s"} | storage))
    cfg = write_config(tmp_path / f"traind-{'trainer' if trainer else 'watch'}.toml",
                       run="exp", output_dir=out, state_dir=tmp_path / "state",
                       storage=section)
    text = cfg.read_text()
    if trainer:
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)
        argv = [sys.executable, str(script), str(out), "{resume_from}"]
        text += f'[trainer]\ncommand = {json.dumps(argv)}\nstop_grace = "5s"\n'
    cfg.write_text(text)
    return cfg


def status(cfg: Path) -> dict[str, Any]:
    """``traind status --json`` of the running daemon."""
    done = subprocess.run([sys.executable, "-m", "traind", "status", "--json", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=30, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def committed(daemon: DaemonProcess, tag: str, timeout: float = 60) -> Event:
    return daemon.wait_for(is_event("checkpoint_committed", tag=tag), timeout=timeout)


def test_a_store_down_at_start_is_waited_for_before_a_fresh_start(
    tmp_path: Path, server: SeaweedS3
) -> None:
    """With an empty output_dir the daemon waits for the store (status answers meanwhile
    and shows it), starts the trainer once the store is up, and commits its checkpoint."""
    cfg = s3_config(tmp_path, server, trainer=True)
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for(lambda e: e.get("event") == "store_unreachable"
                        and len(daemon.named("store_unreachable")) >= 3, timeout=30)
        assert daemon.proc.poll() is None
        assert not daemon.named("child_started")
        shown = status(cfg)
        assert shown["state"] == "waiting_for_store"
        assert any("store_unreachable" in json.dumps(e) for e in shown["errors"])
        assert "waiting for the store" in daemon.named("store_unreachable")[0]["hint"]
        server.start()
        daemon.wait_for("store_reachable", timeout=90)
        daemon.wait_for(is_event("child_output", line="resuming from scratch"), timeout=60)
        committed(daemon, "checkpoint-1")
        assert daemon.stop(timeout=60) == 0
    finally:
        daemon.kill()


def test_with_a_resume_point_the_trainer_starts_while_the_store_is_down(
    tmp_path: Path, server: SeaweedS3
) -> None:
    """A checkpoint committed before is resumed from at once while the store is down; the
    trainer's new checkpoint is snapshot meanwhile and committed once the store is up."""
    out = tmp_path / "out"
    server.start()
    watcher = DaemonProcess(s3_config(tmp_path, server, trainer=False))
    try:
        write_checkpoint(out, 1)
        committed(watcher, "checkpoint-1")
        assert watcher.stop() == 0
    finally:
        watcher.kill()
    server.stop()
    cfg = s3_config(tmp_path, server, trainer=True)
    daemon = DaemonProcess(cfg)
    try:
        started = time.monotonic()
        daemon.wait_for(is_event("child_output", line=f"resuming from {out / 'checkpoint-1'}"),
                        timeout=60)
        assert time.monotonic() - started < 30  # not after a wait for the store
        daemon.wait_for(is_event("checkpoint_staged", tag="checkpoint-2"), timeout=60)
        assert status(cfg)["state"] == "running"
        assert not daemon.named("checkpoint_committed")
        server.start()
        committed(daemon, "checkpoint-2", timeout=120)
        assert daemon.stop(timeout=60) == 0
    finally:
        daemon.kill()
    assert daemon.named("store_unreachable")[0]["resume_from"] == str(out / "checkpoint-1")


@pytest.mark.parametrize(("storage", "message"), [
    ({"bucket": "no-such-bucket"}, "bucket 'no-such-bucket' does not exist"),
    ({"secret_access_key": "wrong-secret-0123456789"}, "secret access key does not match"),
], ids=["no-such-bucket", "bad-secret"])
def test_a_permanent_store_error_at_start_fails_fast(
    tmp_path: Path, server: SeaweedS3, storage: dict[str, str], message: str
) -> None:
    """A store that answers with a permanent error ends ``traind run`` at once, exit 1,
    naming the problem; the trainer never starts."""
    server.start()
    daemon = DaemonProcess(s3_config(tmp_path, server, trainer=True, **storage))
    try:
        started = time.monotonic()
        rc = daemon.proc.wait(timeout=60)
        took = time.monotonic() - started
    finally:
        daemon.kill()
    assert rc == 1
    assert message in "".join(daemon.raw)
    assert not daemon.named("child_started")
    assert took < 20

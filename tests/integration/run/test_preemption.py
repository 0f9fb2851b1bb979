"""``traind run`` preempted through the real CLI: SIGTERM right after a save stops the
trainer, commits what it left complete newest first within ``stop_timeout``, and says in
its exit code and last log line whether everything was stored."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.checkpoints import setup, stored
from tests.support.daemon import DaemonProcess, Event
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import running_seaweed
from tests.support.tiny_train import QUIET_ENV, train_command

from traind.cli import EXIT_UNSTORED
from traind.layout.markers import EXPLICIT_MARKER

MIB = 1024 * 1024

# A trainer that saves the given checkpoints (data files first, marker last, as
# transformers does), prints "saved", then trains on until SIGTERM.
TRAINER = """
import hashlib, json, os, sys, time
out, explicit, plan = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3])
for step, mib in plan:
    d = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(d)
    for i in range(2):
        with open(os.path.join(d, f"shard-{i}.bin"), "wb") as f:
            for _ in range(mib // 2):
                f.write(os.urandom(1024 * 1024))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)
    if explicit:
        open(os.path.join(d, ".traind-complete"), "w").close()
print("saved", flush=True)
time.sleep(600)
"""


def shipped_timings(text: str) -> str:
    """The test config with the shipped settle and poll_interval defaults (5 s, 1 s)."""
    return text.replace('settle = "1s"', 'settle = "5s"').replace(
        'poll_interval = "200ms"', 'poll_interval = "1s"')


def trainer_config(tmp_path: Path, out: Path, plan: list[tuple[int, int]], explicit: bool) -> str:
    """The [trainer] section running TRAINER with ``plan`` (step, MiB)."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    argv = [sys.executable, str(script), str(out), "1" if explicit else "0", json.dumps(plan)]
    return f'[trainer]\ncommand = {json.dumps(argv)}\nstop_grace = "5s"\n'


def preempt(daemon: DaemonProcess) -> float:
    """Wait until the trainer said it saved, SIGTERM 0.2 s later; return the time sent."""
    daemon.wait_for(lambda e: e.get("event") == "child_output" and e.get("line") == "saved",
                    timeout=120)
    time.sleep(0.2)
    daemon.proc.send_signal(signal.SIGTERM)
    return time.monotonic()


def sha256_tree(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.iterdir()) if p.is_file() and p.name != EXPLICIT_MARKER}


def last_event(daemon: DaemonProcess) -> Event:
    daemon.kill()  # joins the reader: every line is in
    return daemon.events[-1]


@pytest.mark.parametrize("explicit", [False, True], ids=["settle", "explicit-marker"])
def test_sigterm_right_after_a_save_commits_it(tmp_path: Path, explicit: bool) -> None:
    """A checkpoint completed 0.2 s before SIGTERM is in the store, byte for byte, when
    traind exits 0 — with the trainer's marker alone or TraindCallback's explicit one."""
    out, store, cfg = setup(tmp_path, extra="")
    text = shipped_timings(cfg.read_text())
    text = text.replace('stop_timeout = "10s"', 'stop_timeout = "60s"')
    cfg.write_text(text + trainer_config(tmp_path, out, [(1, 2), (2, 256)], explicit))
    daemon = DaemonProcess(cfg)
    try:
        preempt(daemon)
        rc = daemon.proc.wait(timeout=120)
    finally:
        daemon.kill()
    assert rc == 0, "".join(daemon.raw[-30:])
    committed = stored(store, "exp")
    assert sorted(committed) == ["checkpoint-1", "checkpoint-2"]
    for tag in committed:
        want = sha256_tree(out / tag)
        assert {k: v for k, v in committed[tag].items() if k != EXPLICIT_MARKER} == want
    assert daemon.events[-1]["event"] == "daemon_stopped"
    assert daemon.events[-1]["unstored"] == []
    assert [e["child"] for e in daemon.named("child_exited")] == ["trainer"]


def test_what_misses_stop_timeout_is_named_and_the_exit_code_says_so(tmp_path: Path) -> None:
    """The newest checkpoint is committed first; an older one too big for the rest of
    ``stop_timeout`` is named in the last log line and traind exits EXIT_UNSTORED."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        storage = server.storage_toml(part_size="5MiB", concurrency=1, max_bandwidth="2MB")
        out, _, cfg = setup(tmp_path, storage=storage)
        text = shipped_timings(cfg.read_text())
        text = text.replace('stop_timeout = "10s"', 'stop_timeout = "4s"')
        cfg.write_text(text + trainer_config(tmp_path, out, [(1, 64), (2, 2)], False))
        daemon = DaemonProcess(cfg)
        try:
            sent = preempt(daemon)
            rc = daemon.proc.wait(timeout=120)
            took = time.monotonic() - sent
            last = last_event(daemon)
        finally:
            daemon.kill()
        client = server.client()
        try:
            listed = client.list_objects_v2(Bucket="ckpts", Prefix="exp/").get("Contents", [])
        finally:
            client.close()
    assert rc == EXIT_UNSTORED, "".join(daemon.raw[-30:])
    assert last["event"] == "daemon_stopped"
    assert last["unstored"] == ["checkpoint-1"]
    manifests = sorted(o["Key"] for o in listed if o["Key"].endswith("traind-manifest.json"))
    assert manifests == ["exp/checkpoint-2/traind-manifest.json"]
    assert took < 4 + 5 + 30  # stop_timeout after the trainer's stop, with room for load


def test_sigterm_without_a_trainer_waits_for_settle_then_commits(tmp_path: Path) -> None:
    """With no ``[trainer]`` and no callback (a sidecar beside an HF trainer it did not
    start), SIGTERM right after a save waits, within ``stop_timeout``, for the checkpoint
    to settle, commits it to a real S3 store, and only then exits 0."""
    need_module("trl")
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        out, _, cfg = setup(tmp_path, storage=server.storage_toml())
        text = shipped_timings(cfg.read_text())
        cfg.write_text(text.replace('stop_timeout = "10s"', 'stop_timeout = "30s"'))
        daemon = DaemonProcess(cfg)
        trainer = None
        try:
            daemon.wait_for("daemon_ready", timeout=60)
            trainer = subprocess.Popen(
                train_command(out, max_steps=2, save_steps=1), env={**os.environ, **QUIET_ENV},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            marker = out / "checkpoint-2" / "trainer_state.json"
            deadline = time.monotonic() + 180
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert marker.exists(), "the trainer saved no checkpoint-2"
            time.sleep(0.2)
            daemon.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            rc = daemon.proc.wait(timeout=60)
            took = time.monotonic() - sent
            assert trainer.wait(timeout=120) == 0
        finally:
            if trainer is not None and trainer.poll() is None:
                os.killpg(trainer.pid, signal.SIGKILL)
                trainer.wait(timeout=10)
            daemon.kill()
        client = server.client()
        try:
            listed = client.list_objects_v2(Bucket="ckpts", Prefix="exp/").get("Contents", [])
        finally:
            client.close()
    manifests = sorted(o["Key"] for o in listed if o["Key"].endswith("traind-manifest.json"))
    assert rc == 0, "".join(daemon.raw[-30:])
    assert manifests == [f"exp/checkpoint-{n}/traind-manifest.json" for n in (1, 2)]
    assert daemon.events[-1]["event"] == "daemon_stopped"
    assert daemon.events[-1]["unstored"] == []
    waited = daemon.named("checkpoints_settling_at_stop")
    assert waited
    assert "checkpoint-2" in waited[0]["checkpoints"]
    assert took < 30, took  # settle (5 s) and the upload, well inside stop_timeout

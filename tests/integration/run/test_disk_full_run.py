"""``traind run`` with output_dir and state_dir on one small real tmpfs, a real tiny TRL
trainer that keeps 3 checkpoints, and a store that goes down after start: the daemon lets
go of the oldest rotated-away snapshots instead of filling the disk, so the trainer
finishes and the daemon stays up; once the store is back, what was kept is committed. A
daemon restarted on a disk that filled meanwhile makes room the same way before anything
else."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
from tests.support.checkpoints import stored, write_checkpoint
from tests.support.daemon import DaemonProcess, is_event, write_config
from tests.support.net import free_port
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import running_seaweed
from tests.support.tiny_train import QUIET_ENV, train_command
from tests.support.tmpfs import fill, remount, tmpfs

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.protocol.testing import MemoryBackend

STEPS = 24
"""Checkpoints the trainer saves: a tiny one is ~300 KiB, so 6 MiB hold the trainer's own
3 (+1 being saved), the journal and logs, but not every checkpoint of the run."""


def daemon_run(out: Path) -> RunIdentity:
    """The run of the daemons these tests start: ``exp``, writing to ``out``."""
    return RunIdentity("exp", Path(os.path.realpath(out)))


def _when(event: dict[str, object]) -> float:
    """The wall-clock time an event was logged at."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return bytes(r.read())


def test_full_disk_drops_oldest_snapshots_and_training_goes_on(tmp_path: Path) -> None:
    """The trainer finishes, the daemon stays up, each dropped snapshot is an error event
    (also in ``traind status`` and /metrics), and with the store back every kept
    checkpoint is committed and staging is empty."""
    need_module("trl")
    with tmpfs(tmp_path / "fs", "6m") as fs, tmpfs(tmp_path / "storefs", "64m") as storefs:
        out, state, store = fs / "out", fs / "state", storefs / "store"
        argv = train_command(out, max_steps=STEPS, save_steps=1, save_total_limit=3,
                             callback=True, step_sleep=0.2)
        env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
        port = free_port()
        cfg = write_config(
            tmp_path / "traind.toml", run="exp", output_dir=out, state_dir=state,
            storage=f'type = "local"\npath = "{store}"', status_port=port,
            extra=f"""
[trainer]
command = {json.dumps(argv)}
env = {{ {env} }}
progress_timeout = "120s"
restart = {{ policy = "on-failure", backoff_initial = "0.5s", max_restarts = 1 }}
""",
        )
        daemon = DaemonProcess(cfg)
        try:
            daemon.wait_for("daemon_ready", timeout=60)
            remount(storefs, "ro")  # the store is down from now on
            try:
                exited = daemon.wait_for(
                    lambda e: e.get("event") == "child_exited", timeout=240
                )
                assert exited["returncode"] == 0, "".join(daemon.raw[-40:])
                assert daemon.proc.poll() is None  # the daemon is alive, waiting for the store
                dropped = daemon.named("checkpoint_dropped")
                assert dropped, "".join(daemon.raw[-40:])
                assert all(e["level"] == "error" for e in dropped)
                assert {"tag", "step", "bytes", "free_bytes", "floor", "reason"} <= set(dropped[0])
                assert f"checkpoint-{STEPS}" not in {e["tag"] for e in dropped}
                metrics = _get(port, "/metrics").decode()
                assert f"traind_checkpoints_dropped_total {len(dropped)}.0" in metrics
                shown = subprocess.run(
                    [sys.executable, "-m", "traind", "status", "-c", str(cfg)],
                    capture_output=True, text=True, timeout=30, env={**os.environ},
                )
                assert shown.returncode == 0, shown.stdout + shown.stderr
                line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("dropped "))
                assert f"{len(dropped)} not stored" in line
                assert all(e["tag"] in line for e in dropped)
            finally:
                remount(storefs, "rw")  # the store is back
            assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-40:])
        finally:
            daemon.kill()
        assert not daemon.named("journal_write_failed")
        assert not daemon.named("child_backoff")
        journal = Journal.in_state_dir(state, daemon_run(out))
        try:
            gone = {e.tag for e in journal.entries_sync("dropped")}
        finally:
            journal.close()
        assert {e["tag"] for e in dropped} <= gone  # journalled: no restart resurrects them
        kept = {f"checkpoint-{n}" for n in range(1, STEPS + 1)} - gone
        missing = kept - set(stored(store, "exp"))
        assert not missing, [e for e in daemon.events if e.get("tag") in missing]
        assert set(stored(store, "exp")) == kept
        assert list((state / "staging").glob("*/*")) == []


async def _pinned_state(out: Path, state: Path, steps: int) -> None:
    """Snapshots of checkpoint-1..steps waiting for the store, all but the newest rotated
    away from ``out`` (what a daemon killed while the store was down leaves)."""
    journal = Journal.in_state_dir(state, daemon_run(out))
    streamer = Streamer("exp", state, MemoryBackend("exp"), journal)
    try:
        for step in range(1, steps + 1):
            tag = f"checkpoint-{step}"
            write_checkpoint(out, step, size=256 * 1024)
            await streamer.stage(tag, step, out / tag)
            await journal.set_state(tag, "ready")
        for step in range(1, steps):
            shutil.rmtree(out / f"checkpoint-{step}")
    finally:
        journal.close()


@pytest.mark.parametrize("left", [160 * 1024, 0])
async def test_restart_on_a_full_disk_makes_room_first(tmp_path: Path, left: int) -> None:
    """A daemon restarted on a disk that filled meanwhile (to the last byte, too) stays up
    and drops the oldest rotated-away snapshots before anything else (the one being
    uploaded last), keeping the newest; the rest are committed."""
    with tmpfs(tmp_path / "fs", "4m") as fs:
        out, state, store = fs / "out", fs / "state", tmp_path / "store"
        await _pinned_state(out, state, steps=4)
        fill(fs, leave=left)
        cfg = write_config(tmp_path / "traind.toml", run="exp", output_dir=out, state_dir=state,
                           storage=f'type = "local"\npath = "{store}"')
        daemon = DaemonProcess(cfg, env={"TRAIND_CHECKPOINTS__MIN_FREE_SPACE": "1x"})
        try:
            await asyncio.to_thread(daemon.wait_for, "checkpoint_dropped", 60)
            await asyncio.to_thread(
                daemon.wait_for, lambda e: e.get("event") == "checkpoint_committed"
                and e["tag"] == "checkpoint-4", 60,
            )
            assert daemon.stop() == 0, "".join(daemon.raw[-40:])
        finally:
            daemon.kill()
    dropped = [e["tag"] for e in daemon.named("checkpoint_dropped")]
    assert dropped[0] == "checkpoint-1"
    assert dropped == sorted(dropped, key=lambda t: int(t.split("-")[1]))  # in flight: last
    assert "checkpoint-4" not in dropped
    let_go = {t for e in daemon.named("checkpoints_dropped_full_disk") for t in e["tags"]}
    assert set(stored(store, "exp")) == {f"checkpoint-{n}" for n in range(1, 5)} - set(
        dropped) - let_go
    assert not daemon.named("journal_write_failed")


BIG = 272
"""tiny_train's ``--hidden-size`` for checkpoints of about 16 MiB: the trainer's two and
one being saved fit in FS_SIZE, one snapshot more does not."""
FS_SIZE = "60m"


def test_store_down_a_minute_with_big_checkpoints_never_kills_the_trainer(
    tmp_path: Path,
) -> None:
    """Checkpoints over a quarter of the disk, the trainer keeping two and saving every second, the
    S3 store (real SeaweedFS) down for a minute from before the first save: the trainer
    finishes, traind lets go of what the trainer rotated away before its next save, and once
    the store is back the newest checkpoint is committed and staging is empty."""
    need_module("trl")
    need_module("aiobotocore")
    weed = need_binary("weed")
    with tmpfs(tmp_path / "fs", FS_SIZE) as fs, running_seaweed(weed, tmp_path / "s3") as server:
        server.create_bucket("ckpts")
        out, state = fs / "out", fs / "state"
        steps = 80
        argv = train_command(out, max_steps=steps, save_steps=1, save_total_limit=2,
                             step_sleep=0.8, hidden_size=BIG)
        env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
        cfg = write_config(
            tmp_path / "traind.toml", run="exp", output_dir=out, state_dir=state,
            storage=server.storage_toml(), extra=f"""
[trainer]
command = {json.dumps(argv)}
env = {{ {env} }}
progress_timeout = "120s"
restart = {{ policy = "never" }}
""")
        shipped = {"TRAIND_CHECKPOINTS__SETTLE": "5s", "TRAIND_CHECKPOINTS__POLL_INTERVAL": "1s"}
        daemon = DaemonProcess(cfg, env=shipped)
        try:
            daemon.wait_for("daemon_ready", timeout=60)
            server.stop()  # down before the trainer's first save
            daemon.wait_for("checkpoint_staged", timeout=120)
            time.sleep(60)
            back = time.time()
            server.start()
            exited = daemon.wait_for("child_exited", timeout=240)
            assert exited["returncode"] == 0, "".join(daemon.raw[-40:])
            rc = daemon.proc.wait(timeout=240)
        finally:
            daemon.kill()
            (tmp_path / "traind.log").write_text("".join(daemon.raw))
        used = shutil.disk_usage(fs).used
    assert rc == 0, "".join(daemon.raw[-40:])
    committed = daemon.named("checkpoint_committed")
    assert f"checkpoint-{steps}" in {e["tag"] for e in committed}
    first = min(_when(e) for e in committed)
    assert first - back < 120
    assert daemon.named("checkpoint_dropped")
    assert not daemon.named("journal_write_failed")
    assert used < 40 * 1024 * 1024  # staging let go: the trainer's two checkpoints and logs


def test_store_back_on_a_disk_full_to_the_last_byte_commits_the_newest(tmp_path: Path) -> None:
    """The S3 store (real SeaweedFS) comes back to a disk full to the last byte with three
    checkpoints waiting that the trainer still holds: the journal's reserve lets traind
    commit the newest and drop the other two with one error naming them, and stop with
    exit 0."""
    need_module("aiobotocore")
    weed = need_binary("weed")
    with tmpfs(tmp_path / "fs", "8m") as fs, running_seaweed(weed, tmp_path / "s3") as server:
        server.create_bucket("ckpts")
        out, state = fs / "out", fs / "state"
        cfg = write_config(tmp_path / "traind.toml", run="exp", output_dir=out,
                           state_dir=state, storage=server.storage_toml())
        daemon = DaemonProcess(cfg)
        try:
            daemon.wait_for("daemon_ready", timeout=60)
            server.stop()
            for step in (1, 2, 3):
                write_checkpoint(out, step, size=512 * 1024)
                daemon.wait_for(is_event("checkpoint_complete", tag=f"checkpoint-{step}"), 30)
            fill(fs)
            daemon.wait_for("disk_space_low", timeout=30)
            server.start()
            daemon.wait_for("checkpoints_dropped_full_disk", timeout=120)
            free = shutil.disk_usage(fs).free
            assert daemon.stop() == 0, "".join(daemon.raw[-40:])
        finally:
            daemon.kill()
            (tmp_path / "traind.log").write_text("".join(daemon.raw))
        client = server.client()
        try:
            listed = client.list_objects_v2(Bucket="ckpts", Prefix="exp/").get("Contents", [])
        finally:
            client.close()
    manifests = sorted(o["Key"] for o in listed if o["Key"].endswith("traind-manifest.json"))
    assert manifests == ["exp/checkpoint-3/traind-manifest.json"]
    assert [e["tags"] for e in daemon.named("checkpoints_dropped_full_disk")] == [
        ["checkpoint-2", "checkpoint-1"]]
    assert daemon.named("journal_reserve_released")
    assert not daemon.named("journal_write_failed")
    assert free < 256 * 1024  # still full: the reserve, not freed space, let it record

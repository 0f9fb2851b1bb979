"""A claim left by a dead host never blocks a tag, through the real CLI on real SeaweedFS:
host A killed (-9) or stopped (SIGTERM past stop_timeout) mid-upload of checkpoint-5; a
fresh host B saving checkpoint-5 again commits its own bytes once A's claim is stale (at
once when A released it), and nothing A uploaded of it is left in the store."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.checkpoints import write_checkpoint
from tests.support.daemon import DaemonProcess, write_config
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import SeaweedS3, running_seaweed

from traind.cli import EXIT_UNSTORED

MIB = 1024 * 1024
PREFIX = "exp/checkpoint-5/"


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS with bucket ``ckpts`` for this test."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        yield server


def host(tmp_path: Path, name: str, server: SeaweedS3, storage_extra: str,
         stop_timeout: str = "10s") -> Path:
    """Host ``name``'s config: its own output_dir and state_dir, the shared run and store."""
    root = tmp_path / name
    (root / "out").mkdir(parents=True)
    storage = server.storage_toml() + storage_extra
    cfg = write_config(root / "traind.toml", run="exp", output_dir=root / "out",
                       state_dir=root / "state", storage=storage)
    cfg.write_text(cfg.read_text().replace('stop_timeout = "10s"',
                                           f'stop_timeout = "{stop_timeout}"'))
    return cfg


def tree(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()}


def keys(server: SeaweedS3) -> set[str]:
    listing = server.client().list_objects_v2(Bucket="ckpts", Prefix=PREFIX)
    return {str(o["Key"])[len(PREFIX):] for o in listing.get("Contents", [])}


def host_a_mid_upload(tmp_path: Path, server: SeaweedS3, stop_timeout: str) -> DaemonProcess:
    """Host A with checkpoint-4 committed and checkpoint-5 (8 MiB at 1 MiB/s) uploading."""
    cfg = host(tmp_path, "a", server, 'max_bandwidth = "1MiB"\nclaim_ttl = "3s"\n',
               stop_timeout)
    a = DaemonProcess(cfg)
    try:
        a.wait_for("daemon_ready", timeout=60)
        write_checkpoint(tmp_path / "a" / "out", 4)
        a.wait_for(lambda e: e.get("event") == "checkpoint_committed"
                   and e.get("tag") == "checkpoint-4", timeout=60)
        write_checkpoint(tmp_path / "a" / "out", 5, size=4 * MIB)
        (tmp_path / "a" / "out" / "checkpoint-5" / "a-only.bin").write_bytes(b"host a")
        a.wait_for(lambda e: e.get("event") == "checkpoint_complete"
                   and e.get("tag") == "checkpoint-5", timeout=60)
        deadline = time.monotonic() + 60
        while "a-only.bin" not in keys(server):  # its upload under way: some objects are in
            assert time.monotonic() < deadline, "host a uploaded nothing of checkpoint-5"
            time.sleep(0.1)
    except BaseException:
        a.kill()
        raise
    return a


def host_b_commits_its_own(tmp_path: Path, server: SeaweedS3, claim_ttl: str,
                           a_left: set[str]) -> None:
    """Fresh host B saves checkpoint-5 with its own bytes: committed by B after a
    takeover, pulled verified, and nothing of A's left under the tag."""
    cfg = host(tmp_path, "b", server, f'claim_ttl = "{claim_ttl}"\n')
    b = DaemonProcess(cfg)
    try:
        b.wait_for("daemon_ready", timeout=60)
        mine = write_checkpoint(tmp_path / "b" / "src", 5, size=MIB)
        (tmp_path / "b" / "src" / "checkpoint-5").rename(tmp_path / "b" / "out" / "checkpoint-5")
        taken = b.wait_for("checkpoint_claim_taken_over", timeout=60)
        assert taken["level"] == "error"
        b.wait_for(lambda e: e.get("event") == "checkpoint_committed"
                   and e.get("tag") == "checkpoint-5", timeout=60)
        assert b.stop() == 0
    finally:
        b.kill()
    assert "a-only.bin" in a_left  # A's objects were there, and are gone:
    left = keys(server)
    assert "a-only.bin" not in left
    assert left - {k for k in left if k.startswith("traind-takeover-")} == {
        *mine, "traind-manifest.json", "traind-writer.json"}
    listing = server.client().list_multipart_uploads(Bucket="ckpts", Prefix=PREFIX)
    assert not listing.get("Uploads")
    pulled = subprocess.run(
        [sys.executable, "-m", "traind", "pull", "-c", str(cfg), "checkpoint-5",
         str(tmp_path / "pulled")], capture_output=True, text=True, timeout=90)
    assert pulled.returncode == 0, pulled.stderr
    assert tree(tmp_path / "pulled" / "checkpoint-5") == mine


def test_a_host_killed_mid_upload_is_taken_over_when_stale(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    """Host A killed -9 while uploading checkpoint-5 (claim made, no manifest): fresh host
    B waits while A's claim is fresh, then takes it over and commits its own checkpoint-5."""
    a = host_a_mid_upload(tmp_path, seaweed, "10s")
    a.kill()
    a_left = keys(seaweed)
    assert "traind-manifest.json" not in a_left
    host_b_commits_its_own(tmp_path, seaweed, "3s", a_left)


def test_a_host_stopped_mid_upload_releases_its_claim(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    """Host A SIGTERMed while uploading checkpoint-5, past its stop_timeout: exit 75, and
    its claim released, so host B (claim_ttl ten minutes) takes it over at once."""
    a = host_a_mid_upload(tmp_path, seaweed, "1s")
    try:
        assert a.stop() == EXIT_UNSTORED
    finally:
        a.kill()
    assert [e["tag"] for e in a.named("checkpoint_claim_released")] == ["checkpoint-5"]
    claim = json.loads(seaweed.client().get_object(
        Bucket="ckpts", Key=PREFIX + "traind-writer.json")["Body"].read())
    assert claim["renewed_at"] == 0
    host_b_commits_its_own(tmp_path, seaweed, "10m", keys(seaweed))


def test_a_live_hosts_claim_is_waited_on_and_status_says_so(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    """Host A alive and uploading checkpoint-5 slowly (renewing its 3 s claim): host B's
    checkpoint-5 waits (checkpoint_claim_held once, ``traind status`` shows it waiting on
    A's claim), is never taken over, and ends a conflict once A commits."""
    a = host_a_mid_upload(tmp_path, seaweed, "10s")
    cfg = host(tmp_path, "b", seaweed, 'claim_ttl = "3s"\n')
    b = DaemonProcess(cfg)
    try:
        b.wait_for("daemon_ready", timeout=60)
        write_checkpoint(tmp_path / "b" / "out", 5, size=MIB)
        held = b.wait_for("checkpoint_claim_held", timeout=60)
        status = subprocess.run(
            [sys.executable, "-m", "traind", "status", "-c", str(cfg), "--json"],
            capture_output=True, text=True, timeout=60)
        page = subprocess.run([sys.executable, "-m", "traind", "status", "-c", str(cfg)],
                              capture_output=True, text=True, timeout=60)
        a.wait_for(lambda e: e.get("event") == "checkpoint_committed"
                   and e.get("tag") == "checkpoint-5", timeout=60)
        conflict = b.wait_for("checkpoint_conflict", timeout=60)
        assert b.stop() == 0
        assert a.stop() == 0
    finally:
        a.kill()
        b.kill()
    assert held["holder"] == conflict["theirs"]
    waiting = json.loads(status.stdout)["held"]
    assert [(w["tag"], w["holder"]) for w in waiting] == [("checkpoint-5", held["holder"])]
    assert f"waiting    checkpoint-5 on writer {held['holder']}'s claim" in page.stdout
    assert not b.named("checkpoint_claim_taken_over")
    assert len(b.named("checkpoint_claim_held")) == 1

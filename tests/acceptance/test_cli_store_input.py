"""What is planted in a local store, through the real CLI and daemon: ``push`` to a tag that
is a link is refused, naming it, with nothing written where it leads; a data file that is a
FIFO, a link to ``/dev/zero`` or a directory is that checkpoint's corruption for ``pull``
and ``verify`` (never a hang, never a store failure); ``pull`` restores through no link at
its destination; and a daemon restoring stops on SIGTERM within its stop timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.checkpoints import write_checkpoint
from tests.support.daemon import DaemonProcess, write_config

from traind.layout.keys import MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, Writer

RUN = "exp"


def traind(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI; what would hang fails by the timeout instead."""
    return subprocess.run([sys.executable, "-m", "traind", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def host(tmp_path: Path, name: str = "h", stop_timeout: str = "10s") -> Path:
    """The config of a host on the local store ``tmp_path/store``."""
    (tmp_path / name / "out").mkdir(parents=True)
    cfg = write_config(tmp_path / name / "traind.toml", run=RUN,
                       output_dir=tmp_path / name / "out", state_dir=tmp_path / name / "state",
                       storage=f'type = "local"\npath = "{tmp_path / "store"}"')
    cfg.write_text(cfg.read_text().replace('stop_timeout = "10s"',
                                           f'stop_timeout = "{stop_timeout}"'))
    return cfg


def pushed(tmp_path: Path, cfg: Path, *steps: int) -> None:
    """Commit ``checkpoint-<step>`` for each of ``steps`` with ``traind push``."""
    for step in steps:
        write_checkpoint(tmp_path / "h/out", step)
        done = traind("push", "-c", str(cfg), str(tmp_path / f"h/out/checkpoint-{step}"))
        assert done.returncode == 0, done.stderr


def test_push_to_a_linked_tag_is_refused(tmp_path: Path) -> None:
    """A tag directory in the store that is a link elsewhere: ``push`` of that tag exits
    non-zero naming the link, writes nothing there, and ``list`` shows no such checkpoint."""
    cfg = host(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "shard-0.bin").write_bytes(b"someone else's")
    (tmp_path / "store" / RUN).mkdir(parents=True)
    (tmp_path / "store" / RUN / "checkpoint-3").symlink_to(elsewhere)
    write_checkpoint(tmp_path / "h/out", 3)
    push = traind("push", "-c", str(cfg), str(tmp_path / "h/out/checkpoint-3"))
    assert push.returncode != 0
    assert f"{tmp_path / 'store' / RUN / 'checkpoint-3'} is a symbolic link" in push.stderr
    assert "committed" not in push.stdout + push.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["shard-0.bin"]
    assert (elsewhere / "shard-0.bin").read_bytes() == b"someone else's"
    listed = traind("list", "-c", str(cfg), "--json")
    assert listed.returncode == 0, listed.stderr
    assert "checkpoint-3" not in listed.stdout


PLANTED = {"fifo": "a FIFO", "dev-zero": "a symbolic link", "directory": "a directory"}


def plant(kind: str, at: Path) -> None:
    """Put a FIFO (never written), a link to /dev/zero or a directory at ``at``."""
    at.unlink()
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "dev-zero":
        at.symlink_to("/dev/zero")
    else:
        at.mkdir()


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_pull_and_verify_pass_over_a_file_not_regular(tmp_path: Path, kind: str) -> None:
    """A data file of the newest checkpoint that is not a regular file: ``pull latest``
    falls back to the one before, ``pull`` of that tag and ``verify`` name the file as
    corrupt and exit 1, and ``verify --all`` reports every checkpoint — none hangs."""
    cfg = host(tmp_path)
    pushed(tmp_path, cfg, 1, 2)
    plant(kind, tmp_path / "store" / RUN / "checkpoint-2/shard-0.bin")
    dest = tmp_path / "pulled"
    latest = traind("pull", "-c", str(cfg), "latest", str(dest))
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.strip() == str(dest / "checkpoint-1")
    assert "checkpoint-2 (latest) is corrupt in the store; pulled checkpoint-1" in latest.stderr
    named = traind("pull", "-c", str(cfg), "checkpoint-2", str(dest))
    assert named.returncode == 1
    assert f"shard-0.bin is {PLANTED[kind]}" in named.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["checkpoint-1"]
    every = traind("verify", "-c", str(cfg), "--all")
    assert every.returncode == 1, every.stdout + every.stderr
    assert "checkpoint-1: OK" in every.stdout
    assert "checkpoint-2: 1 of 3 files do not match" in every.stdout
    assert f"shard-0.bin is {PLANTED[kind]}" in every.stdout


def test_pull_restores_through_no_link_at_its_destination(tmp_path: Path) -> None:
    """A link where ``pull`` would put the checkpoint (dangling, or to a directory
    elsewhere) is refused as existing: nothing is written where it leads."""
    cfg = host(tmp_path)
    pushed(tmp_path, cfg, 1)
    dest = tmp_path / "pulled"
    dest.mkdir()
    (dest / "checkpoint-1").symlink_to(tmp_path / "nowhere")
    pull = traind("pull", "-c", str(cfg), "checkpoint-1", str(dest))
    assert pull.returncode == 1
    assert f"{dest / 'checkpoint-1'} already exists" in pull.stderr
    assert not (tmp_path / "nowhere").exists()
    assert os.readlink(dest / "checkpoint-1") == str(tmp_path / "nowhere")


def sparse_checkpoint(store: Path, size: int) -> None:
    """Commit ``checkpoint-1`` of one sparse file of ``size`` bytes straight into the store
    (its sha256 is never reached: the restore is stopped first)."""
    tag = store / RUN / "checkpoint-1"
    tag.mkdir(parents=True)
    with open(tag / "shard-0.bin", "wb") as f:
        f.truncate(size)
    manifest = Manifest(run=RUN, tag="checkpoint-1", step=1, created_at=time.time(),
                        files=(FileEntry("shard-0.bin", size, "0" * 64),), host="h",
                        writer=Writer("a" * 32, "h"))
    (tag / MANIFEST_NAME).write_bytes(manifest.to_json())


@pytest.mark.parametrize("kind", ["slow", "fifo"])
def test_a_restoring_daemon_stops_on_sigterm_within_its_stop_timeout(
        tmp_path: Path, kind: str) -> None:
    """``traind run`` on a fresh host restoring a large file (or one that is a FIFO): on
    SIGTERM it exits within its stop timeout, leaving no checkpoint-1 in output_dir."""
    cfg = host(tmp_path, stop_timeout="2s")
    sparse_checkpoint(tmp_path / "store", 3 << 30)
    if kind == "fifo":
        plant("fifo", tmp_path / "store" / RUN / "checkpoint-1/shard-0.bin")
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("restore_starting", timeout=60)
        time.sleep(0.5)  # well inside the copy (a 3 GiB file) or the FIFO's open
        daemon.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = daemon.proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        daemon.kill()
    assert code == 0, "".join(daemon.raw[-20:])
    assert took < 2 + 1.5, f"took {took:.1f} s to stop"
    assert not (tmp_path / "h/out/checkpoint-1").exists()
    assert [json.loads(line)["event"] for line in daemon.raw
            if '"daemon_stopping"' in line][:1] == ["daemon_stopping"]

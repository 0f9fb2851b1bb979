"""A real tiny TRL run supervised by ``traind run`` streams to each remote backend — a real
SeaweedFS S3 server and a real OpenSSH sshd in every transfer mode — and restores from it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.checkpoints import setup
from tests.support.daemon import DaemonProcess
from tests.support.requires import need_module
from tests.support.stores import store_section
from tests.support.tiny_train import QUIET_ENV, train_command


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.fixture(params=["s3", "ssh-sftp", "ssh-openssh", "ssh-rsync"])
def storage_section(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The [storage] body for a freshly started real server of each kind."""
    with store_section(request.param, tmp_path) as body:
        yield body + ('part_size = "5MiB"\n' if request.param == "s3" else "")


def test_trl_run_streams_to_remote_and_restores(tmp_path: Path, storage_section: str) -> None:
    """Every checkpoint of the run is committed remotely; the pulled newest one is byte-equal
    to the trainer's and transformers resumes from it."""
    need_module("trl")
    out = tmp_path / "out"
    argv = train_command(out, max_steps=4, save_steps=1, save_total_limit=2, callback=True)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    trainer = f"[trainer]\ncommand = {json.dumps(argv)}\nenv = {{ {env} }}\n"
    out, _, cfg = setup(tmp_path, extra=trainer)
    text = cfg.read_text()
    start = text.index("[storage]")
    end = text.index("[retention]")
    cfg.write_text(text[:start] + "[storage]\n" + storage_section + "\n" + text[end:])
    daemon = DaemonProcess(cfg)
    try:
        assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-30:])
    finally:
        daemon.kill()
    assert sorted(e["step"] for e in daemon.named("checkpoint_committed")) == [1, 2, 3, 4]
    listing = subprocess.run(
        [sys.executable, "-m", "traind", "list", "-c", str(cfg), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [r["tag"] for r in json.loads(listing.stdout)] == [
        f"checkpoint-{n}" for n in (1, 2, 3, 4)
    ]
    pulled = subprocess.run(
        [sys.executable, "-m", "traind", "pull", "-c", str(cfg), "latest", str(tmp_path / "back")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pulled.returncode == 0, pulled.stderr
    expected = tree_hashes(out / "checkpoint-4")
    expected.pop(".traind-complete", None)
    assert tree_hashes(tmp_path / "back/checkpoint-4") == expected
    resumed = subprocess.run(
        train_command(tmp_path / "back", max_steps=5, save_steps=1, resume=True),
        capture_output=True,
        text=True,
        timeout=240,
        env={**QUIET_ENV, "PATH": "/usr/bin:/bin"},
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "global_step=5" in resumed.stdout

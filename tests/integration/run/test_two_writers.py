"""Two daemons, one run.name, one store (local, SeaweedFS S3, sshd): every checkpoint is
one host's, whole and pullable; the other host is told (log, ``traind status``, the exit
code of ``traind push``) and keeps its files."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.checkpoints import write_checkpoint
from tests.support.daemon import DaemonProcess, Event, write_config
from tests.support.stores import store_section

from traind import config
from traind.layout.manifest import Writer
from traind.protocol import open_storage

TAGS = ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


@pytest.fixture(params=["local", "s3", "ssh"])
def storage_section(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The [storage] body of a fresh store of each kind (a real server for s3 and ssh)."""
    with store_section(request.param, tmp_path) as body:
        yield body


def host_config(tmp_path: Path, name: str, storage: str) -> Path:
    """A config of host ``name``: its own output_dir and state_dir, the shared run and store."""
    root = tmp_path / name
    (root / "out").mkdir(parents=True)
    return write_config(root / "traind.toml", run="exp", output_dir=root / "out",
                        state_dir=root / "state", storage=storage)


def traind(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traind", *args], capture_output=True,
                          text=True, timeout=90)


def tree(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()}


def outcome(daemon: DaemonProcess, tag: str) -> Event:
    return daemon.wait_for(
        lambda e: e.get("event") in {"checkpoint_committed", "checkpoint_conflict"}
        and e.get("tag") == tag, timeout=60)


def test_two_daemons_same_run_one_writer_per_checkpoint(
    tmp_path: Path, storage_section: str
) -> None:
    """Both hosts save checkpoint-1..3 with different bytes: each tag is committed by exactly
    one, pulls verified and byte-equal to it; the other logs checkpoint_conflict, shows it
    in ``traind status`` and keeps its checkpoints."""
    cfgs = {name: host_config(tmp_path, name, storage_section) for name in ("a", "b")}
    daemons = {name: DaemonProcess(cfg) for name, cfg in cfgs.items()}
    written: dict[str, dict[str, dict[str, str]]] = {"a": {}, "b": {}}
    try:
        for daemon in daemons.values():
            daemon.wait_for("daemon_ready", timeout=60)
        for step in (1, 2, 3):
            for name in ("a", "b"):
                written[name][f"checkpoint-{step}"] = write_checkpoint(
                    tmp_path / name / "out", step)
        winner_of = {}
        for tag in TAGS:
            events = {name: outcome(d, tag)["event"] for name, d in daemons.items()}
            assert sorted(events.values()) == ["checkpoint_committed", "checkpoint_conflict"]
            winner_of[tag] = next(n for n, e in events.items() if e == "checkpoint_committed")
        status = {name: json.loads(traind("status", "-c", str(cfg), "--json").stdout)
                  for name, cfg in cfgs.items()}
        for daemon in daemons.values():
            assert daemon.stop() == 0
    finally:
        for daemon in daemons.values():
            daemon.kill()
    for tag, winner in winner_of.items():
        loser = "b" if winner == "a" else "a"
        pulled = traind("pull", "-c", str(cfgs[loser]), tag, str(tmp_path / "pulled" / tag))
        assert pulled.returncode == 0, pulled.stderr
        assert tree(tmp_path / "pulled" / tag / tag) == written[winner][tag]
        assert tree(tmp_path / loser / "out" / tag) == written[loser][tag]  # kept
        errors = [e["message"] for e in status[loser]["errors"]
                  if e["event"] == "checkpoint_conflict"]
        assert any(f"tag={tag}" in m for m in errors), status[loser]["errors"]


def test_push_of_a_tag_another_writer_is_uploading_fails(
    tmp_path: Path, storage_section: str
) -> None:
    """``traind push`` of a tag another host has claimed (its upload under way, its claim
    fresh) exits 1 naming both writers and the held claim, sends nothing and commits
    nothing; the source stays."""
    cfg = host_config(tmp_path, "b", storage_section)
    other = Writer("a" * 32, "host-a")

    async def claim_as_other() -> None:
        store = open_storage(config.load(cfg).storage, "exp")
        try:
            await asyncio.wait_for(store.claim("checkpoint-1", other), 30)
        finally:
            await store.aclose()

    asyncio.run(claim_as_other())
    src = tmp_path / "src"
    hashes = write_checkpoint(src, 1, size=2 * 1024 * 1024)
    pushed = traind("push", "-c", str(cfg), str(src / "checkpoint-1"))
    assert pushed.returncode == 1
    assert f"belongs to writer {other}" in pushed.stderr
    assert "checkpoint_claim_held" in pushed.stderr
    listed = traind("list", "-c", str(cfg), "--json")
    assert json.loads(listed.stdout) == []
    assert tree(src / "checkpoint-1") == hashes
    if storage_section.startswith('type = "local"'):  # and not one byte went out
        assert os.listdir(tmp_path / "store" / "exp" / "checkpoint-1") == ["traind-writer.json"]
    kept = [p.name for p in (tmp_path / "b" / "state" / "staging").glob("*/*")]
    assert kept == ["checkpoint-1"]  # the snapshot is kept, in b's run's staging


def test_check_config_says_how_the_store_keeps_one_writer(
    tmp_path: Path, storage_section: str
) -> None:
    """``traind check-config`` names the atomic primitive each store gets for claims."""
    cfg = host_config(tmp_path, "a", storage_section)
    result = traind("check-config", "-c", str(cfg))
    assert result.returncode == 0, result.stderr
    expected = {"local": "exclusive create (hard link)",
                "s3": "conditional writes (If-None-Match: *)",
                "ssh": "exclusive create over SFTP"}
    kind = storage_section.split('"')[1]
    assert f"checkpoint ownership by {expected[kind]}" in result.stdout


def test_new_host_on_a_shared_output_dir_finds_its_checkpoints_stored(tmp_path: Path) -> None:
    """A daemon with a new state_dir (a new host) on an output_dir whose checkpoints another
    writer committed recognises them byte for byte: no conflict, no error, nothing sent."""
    cfg = host_config(tmp_path, "a", f'type = "local"\npath = "{tmp_path / "store"}"\n')
    first = DaemonProcess(cfg)
    try:
        for step in (1, 2):
            write_checkpoint(tmp_path / "a" / "out", step)
        for tag in TAGS[:2]:
            outcome(first, tag)
        assert first.stop() == 0
    finally:
        first.kill()
    text = cfg.read_text().replace(str(tmp_path / "a" / "state"), str(tmp_path / "new-state"))
    cfg.write_text(text)
    second = DaemonProcess(cfg)
    try:
        for tag in TAGS[:2]:
            second.wait_for(lambda e, t=tag: e.get("event") == "checkpoint_already_stored"
                            and e["tag"] == t, timeout=60)
        assert second.stop() == 0
    finally:
        second.kill()
    assert not [e for e in second.events if e.get("level") == "error"]
    assert not second.named("checkpoint_committed")

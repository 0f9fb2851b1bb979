"""Oddly named directories in output_dir are skipped, and odd file names are stored (real CLI)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.checkpoints import setup, stored, write_checkpoint
from tests.support.daemon import DaemonProcess, is_event

ODD_DIRS = ["checkpoint-201 copy 2", "checkpoint-ü-201", "checkpoint-final"]
"""Names that match ``checkpoint-*`` but give no valid tag or no step."""


def write_odd(out: Path, name: str) -> None:
    d = out / name
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(b"m" * 100)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 201}))


def committed(daemon: DaemonProcess, tag: str) -> None:
    daemon.wait_for(is_event("checkpoint_committed", tag=tag), timeout=30)


def test_odd_directory_names_are_skipped_with_one_warning(tmp_path: Path) -> None:
    """A directory matching the pattern with no valid tag or step is warned about once and
    skipped; the daemon keeps running and commits the checkpoints around it."""
    out, store, cfg = setup(tmp_path)
    expected = {"checkpoint-200": write_checkpoint(out, 200)}
    for name in ODD_DIRS:
        write_odd(out, name)
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        committed(daemon, "checkpoint-200")
        expected["checkpoint-202"] = write_checkpoint(out, 202)
        (out / "checkpoint-ü-201" / "more.bin").write_bytes(b"x")  # a change: scanned again
        committed(daemon, "checkpoint-202")
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert stored(store, "exp") == expected
    skipped = daemon.named("checkpoint_name_skipped")
    assert sorted(e["name"] for e in skipped) == sorted(ODD_DIRS)
    assert all(e["level"] == "warning" for e in skipped)
    assert not daemon.named("checkpoint_unusable")


def test_odd_file_names_inside_a_checkpoint_are_committed(tmp_path: Path) -> None:
    """Files named with spaces, non-ASCII letters, quotes and ``$`` are committed under
    those names, byte-identical, instead of the whole checkpoint being refused."""
    out, store, cfg = setup(tmp_path)
    hashes = write_checkpoint(out, 5)
    names = {"a b.bin": b"space", "ü/ñ.json": b"{}", "$(touch x) 'q' \"dq\".bin": b"quotes"}
    for rel, data in names.items():
        (out / "checkpoint-5" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "checkpoint-5" / rel).write_bytes(data)
    (out / "checkpoint-5" / "trainer_state.json").touch()  # written last, as trainers do
    daemon = DaemonProcess(cfg)
    try:
        committed(daemon, "checkpoint-5")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert set(stored(store, "exp")["checkpoint-5"]) == set(hashes) | set(names)
    assert {n: (store / "exp/checkpoint-5" / n).read_bytes() for n in names} == names

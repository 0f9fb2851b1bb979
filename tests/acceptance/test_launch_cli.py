"""``traind launch list`` and ``traind launch status`` through the real CLI, on a launch of
the ``local`` adapter whose traind is stood in for by a sleeping process and its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from traind.launch.base import Handle
from traind.launch.handles import LaunchRecord, LaunchStore

COMMITTED = {
    "tag": "checkpoint-400", "step": 400, "files": 3, "bytes": 2149659240,
    "sent_bytes": 2149659240, "seconds": 4.2, "mb_per_s": 511.8, "backend": "local:/store/tiny",
    "event": "checkpoint_committed", "level": "info", "timestamp": "2026-12-01T08:22:57.1Z",
}


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A saved local launch "tiny", 20 s old, whose traind runs (a sleep holding its pid
    file) and has logged one commit; yields the environment that finds it."""
    remote = tmp_path / "remote"
    (tmp_path / "project" / "code").mkdir(parents=True)
    (tmp_path / "project" / "traind.toml").write_text("")
    launch_toml = tmp_path / "project" / "launch.toml"
    launch_toml.write_text(f"""
name = "tiny"
backend = "local"

[run]
code_dir = "code"
traind_config = "traind.toml"
remote_dir = "{remote.parent}"

[constraints]
num_gpus = 0

[install]
python = "{sys.executable}"
venv = false
service = "nohup"
""")
    remote.mkdir()
    lines = [{"event": "daemon_starting", "level": "info"}, COMMITTED,
             {"event": "checkpoint_staged", "level": "info", "tag": "checkpoint-500"}]
    (remote / "traind.log").write_text("".join(json.dumps(e) + "\n" for e in lines))
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    (remote / "traind.pid").write_text(f"{sleeper.pid}\n")
    store = LaunchStore(tmp_path / "state")
    store.claim("local-tiny", "tiny")
    born = time.time() - 20
    handle = Handle(backend="local", instance_id="local-tiny", label="tiny", created_at=born)
    store.save(LaunchRecord("tiny", str(launch_toml), handle, str(remote), service="nohup",
                            python=sys.executable, created_at=born))
    try:
        yield {**os.environ, "TRAIND_LAUNCH_STATE": str(tmp_path / "state")}
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def launch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traind", "launch", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_launch_status_reports_commit_as_facts_and_the_launch_uptime(
    launched: dict[str, str],
) -> None:
    """`launch status --json` gives last_commit as an object (not a log line in a string)
    and uptime as the launch's age (not the machine's); the table shows them for people."""
    result = launch(launched, "status", "tiny", "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["traind"] == "running"
    assert 20 <= facts["uptime_seconds"] < 110
    expected = {k: v for k, v in COMMITTED.items() if k not in ("event", "level")}
    assert facts["last_commit"] == expected
    table = launch(launched, "status", "tiny")
    assert table.returncode == 0, table.stderr
    assert "checkpoint-400 (2.0 GiB) at 2026-12-01T08:22:57.1Z" in table.stdout


def test_launch_list_has_headers(launched: dict[str, str], tmp_path: Path) -> None:
    """`launch list` starts with a header row naming its columns."""
    result = launch(launched, "list")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["NAME", "BACKEND", "INSTANCE", "REMOTE_ROOT"]
    assert row.split() == ["tiny", "local", "local-tiny", str(tmp_path / "remote")]

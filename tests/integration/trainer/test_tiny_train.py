"""The tiny TRL training script: rotation, injected crash, resume, injected hang."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from tests.support.requires import need_module
from tests.support.tiny_train import CRASH_EXIT, train_command

RUN_TIMEOUT = 180.0
"""Bound for one run (a 4-step run takes ~6 s on an idle 2-core machine, mostly imports)."""


@pytest.fixture(autouse=True)
def _needs_trl() -> None:
    need_module("torch")
    need_module("trl")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIND_")}
    return env | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | extra


def _train(
    out: Path, env: dict[str, str] | None = None, **opts: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        train_command(out, **opts),
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def _steps_printed(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"^step=(\d+) ", stdout, flags=re.M)]


def _global_step(checkpoint: Path) -> int:
    step: int = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    return step


def _checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*"))


def test_rotation_keeps_the_last_two_checkpoints(tmp_path: Path) -> None:
    """4 steps with save_steps=1, save_total_limit=2 leave checkpoint-3 and checkpoint-4."""
    out = tmp_path / "out"
    run = _train(out, max_steps=4, save_steps=1, save_total_limit=2)
    assert run.returncode == 0, run.stderr
    assert _steps_printed(run.stdout) == [1, 2, 3, 4]
    assert _checkpoints(out) == ["checkpoint-3", "checkpoint-4"]
    assert [_global_step(out / name) for name in _checkpoints(out)] == [3, 4]


def test_crash_then_resume_continues_global_step(tmp_path: Path) -> None:
    """A crash after checkpoint 2 and a --resume run train steps 3-4 only, ending at step 4."""
    out = tmp_path / "out"
    crashed = _train(out, max_steps=4, save_total_limit=2, crash_at_step=2, callback=True)
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    assert _steps_printed(crashed.stdout) == [1, 2]
    assert _checkpoints(out) == ["checkpoint-1", "checkpoint-2"]
    assert (out / "checkpoint-2" / ".traind-complete").is_file()

    resumed = _train(out, max_steps=4, save_total_limit=2, resume=True, callback=True)
    assert resumed.returncode == 0, resumed.stderr
    assert _steps_printed(resumed.stdout) == [3, 4]
    assert _checkpoints(out) == ["checkpoint-3", "checkpoint-4"]
    assert _global_step(out / "checkpoint-4") == 4
    history = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1, 2, 3, 4]


def test_resume_from_a_restored_directory_elsewhere(tmp_path: Path) -> None:
    """TRAIND_RESUME_FROM naming a checkpoint copied to another place resumes from it."""
    first = tmp_path / "first"
    crashed = _train(first, max_steps=3, crash_at_step=2)
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    restored = tmp_path / "restored" / "checkpoint-2"
    shutil.copytree(first / "checkpoint-2", restored)

    out = tmp_path / "fresh"
    resumed = _train(out, env=_env(TRAIND_RESUME_FROM=str(restored)), max_steps=3, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    assert _steps_printed(resumed.stdout) == [3]
    assert _global_step(out / "checkpoint-3") == 3


def test_resume_from_the_final_checkpoint_trains_no_further_step(tmp_path: Path) -> None:
    """Resumed from its checkpoint at max_steps, a run exits 0 having trained no step (not one
    past max_steps, as transformers' Trainer would)."""
    out = tmp_path / "out"
    assert _train(out, max_steps=2, save_steps=1).returncode == 0
    again = _train(out, max_steps=2, save_steps=1, resume=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _steps_printed(again.stdout) == []
    assert _checkpoints(out) == ["checkpoint-1", "checkpoint-2"]


def test_hang_at_step_keeps_the_process_alive(tmp_path: Path) -> None:
    """--hang-at-step 1 stops after checkpoint 1 is saved and stays alive until killed."""
    out = tmp_path / "out"
    heartbeat = tmp_path / "hb.json"
    proc = subprocess.Popen(
        train_command(out, max_steps=3, hang_at_step=1, callback=True),
        env=_env(TRAIND_HEARTBEAT=str(heartbeat)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        marker = out / "checkpoint-1" / ".traind-complete"
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists()
        time.sleep(1.0)
        assert proc.poll() is None
        assert _checkpoints(out) == ["checkpoint-1"]
        assert json.loads(heartbeat.read_text())["step"] == 1
    finally:
        proc.kill()
        proc.wait(timeout=10)

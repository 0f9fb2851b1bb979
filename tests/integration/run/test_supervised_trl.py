"""``traind run`` supervising a real tiny TRL trainer: crash and hang recovery that resumes
from the newest committed checkpoint, and restore-then-resume on a fresh host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.support.checkpoints import setup, stored
from tests.support.daemon import DaemonProcess
from tests.support.requires import need_module
from tests.support.tiny_train import QUIET_ENV, train_command


def trainer_section(out: Path, **opts: object) -> str:
    argv = train_command(out, save_steps=1, callback=True, resume=True, **opts)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    return f"""
[trainer]
command = {json.dumps(argv)}
env = {{ {env} }}
progress_timeout = "4s"
first_progress_timeout = "90s"
stop_grace = "5s"
restart = {{ policy = "on-failure", backoff_initial = "0.2s", max_restarts = 3 }}
"""


def starts(daemon: DaemonProcess) -> list[str]:
    """The resume_from value the trainer printed at each start."""
    return [
        e["line"].split("resume_from=", 1)[1]
        for e in daemon.events
        if e.get("event") == "child_output" and "train_start" in str(e.get("line"))
    ]


def final_step(out: Path) -> int:
    newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    return int(json.loads((newest / "trainer_state.json").read_text())["global_step"])


@pytest.fixture(autouse=True)
def _needs_trl() -> None:
    need_module("trl")


@pytest.mark.parametrize("fault", ["crash_at_step", "hang_at_step"])
def test_fault_mid_run_resumes_from_committed(tmp_path: Path, fault: str) -> None:
    """A crash (or a hang) at step 3 is followed by a restart that resumes from a complete
    checkpoint (committed, or complete and waiting for its upload) — global_step continues to
    the end instead of starting again from 0, and every checkpoint is committed once."""
    out, store, cfg = setup(
        tmp_path, extra=trainer_section(tmp_path / "out", max_steps=6, **{fault: 3})
    )
    daemon = DaemonProcess(cfg)
    try:
        assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-30:])
    finally:
        daemon.kill()
    if fault == "hang_at_step":
        assert daemon.named("trainer_hung")
    resumed = starts(daemon)
    assert len(resumed) == 2, resumed
    assert resumed[0] == "None"
    assert resumed[1].startswith(str(out / "checkpoint-"))
    resume_tag = Path(resumed[1]).name
    complete_at = next(
        i
        for i, e in enumerate(daemon.events)
        if e.get("event") == "checkpoint_complete" and e["tag"] == resume_tag
    )
    relaunched_at = [
        i for i, e in enumerate(daemon.events)
        if e.get("event") == "child_started" and e.get("child") == "trainer"
    ][1]
    assert complete_at < relaunched_at  # it resumed from a checkpoint already complete
    assert not daemon.named("checkpoint_rewritten")  # and saved none of them again
    assert final_step(out) == 6
    assert sorted(stored(store, "exp")) == [f"checkpoint-{n}" for n in range(1, 7)]
    assert daemon.named("run_complete")


def test_fresh_host_restores_then_resumes(tmp_path: Path) -> None:
    """A fresh output_dir with a populated store: restore first, then the trainer resumes."""
    out, store, cfg = setup(tmp_path, extra=trainer_section(tmp_path / "out", max_steps=3))
    first = DaemonProcess(cfg)
    try:
        assert first.proc.wait(timeout=240) == 0, "".join(first.raw[-30:])
    finally:
        first.kill()
    assert sorted(stored(store, "exp"))[-1] == "checkpoint-3"
    shutil.rmtree(out)
    shutil.rmtree(tmp_path / "state")
    cfg.write_text(cfg.read_text().replace('"--max-steps", "3"', '"--max-steps", "5"'))
    second = DaemonProcess(cfg)
    try:
        assert second.proc.wait(timeout=240) == 0, "".join(second.raw[-30:])
    finally:
        second.kill()
    names = [e.get("event") for e in second.events]
    assert names.index("checkpoint_restored") < names.index("supervisor_starting")
    assert starts(second) == [str(out / "checkpoint-3")]
    assert final_step(out) == 5


def test_save_total_limit_one_loses_nothing(tmp_path: Path) -> None:
    """With save_total_limit=1 the trainer deletes each checkpoint at the next save; the
    callback's snapshot handshake still gets every one of them committed."""
    out = tmp_path / "out"
    extra = trainer_section(out, max_steps=5, save_total_limit=1)
    out, store, cfg = setup(tmp_path, extra=extra)
    daemon = DaemonProcess(cfg)
    try:
        assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-30:])
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == [f"checkpoint-{n}" for n in range(1, 6)]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-5"]

"""Runs sharing one state_dir (the default /var/lib/traind is shared by every run on a host)
keep their checkpoints apart: the real CLI, real files, real signals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.support.checkpoints import stored, write_checkpoint
from tests.support.daemon import DaemonProcess, is_event, write_config

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.restore import recovery
from traind.checkpoints.retention import pruner
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.config import CheckpointsConfig, RetentionConfig
from traind.protocol.testing import MemoryBackend


def run_config(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """The config of run ``name``: its own output_dir, the shared state_dir and store."""
    out = tmp_path / f"out-{name}"
    out.mkdir()
    cfg = write_config(
        tmp_path / f"{name}.toml",
        run=name,
        output_dir=out,
        state_dir=tmp_path / "state",
        storage=f'type = "local"\npath = "{tmp_path / "store"}"\n',
    )
    return out, cfg


def save_and_commit(cfg: Path, out: Path, steps: range) -> dict[str, dict[str, str]]:
    """Run the daemon of ``cfg`` while checkpoints ``steps`` are saved, until all are
    committed; return what was saved (tag → path → sha256)."""
    daemon = DaemonProcess(cfg)
    saved = {}
    try:
        daemon.wait_for("daemon_ready", timeout=30)
        for step in steps:
            saved[f"checkpoint-{step}"] = write_checkpoint(out, step)
        for tag in saved:
            daemon.wait_for(is_event("checkpoint_committed", tag=tag), timeout=60)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    return saved


def prune(cfg: Path, *flags: str) -> str:
    """``traind prune`` of ``cfg`` keeping one checkpoint locally; its output."""
    result = subprocess.run(
        [sys.executable, "-m", "traind", "prune", "-c", str(cfg), *flags],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "TRAIND_RETENTION__KEEP_LOCAL": "1"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_new_run_on_a_shared_state_dir_commits_all_its_checkpoints(tmp_path: Path) -> None:
    """Run b saving the tags run a committed from the same state_dir stores every one of
    them; a's records are untouched, and a can still prune its own."""
    out_a, cfg_a = run_config(tmp_path, "a")
    out_b, cfg_b = run_config(tmp_path, "b")
    saved_a = save_and_commit(cfg_a, out_a, range(1, 4))
    saved_b = save_and_commit(cfg_b, out_b, range(1, 4))
    store = tmp_path / "store"
    assert stored(store, "b") == saved_b
    assert stored(store, "a") == saved_a
    plan = [line.split()[:3] for line in prune(cfg_a, "--dry-run").splitlines()]
    assert ["local", "checkpoint-1", "would"] in plan, plan
    assert ["local", "checkpoint-3", "keep"] in plan, plan
    prune(cfg_a)
    assert sorted(p.name for p in out_a.iterdir()) == ["checkpoint-3"]
    assert sorted(p.name for p in out_b.iterdir()) == [f"checkpoint-{n}" for n in (1, 2, 3)]
    assert stored(store, "a") == saved_a  # only local copies were pruned (keep_last = 100)


def test_recovery_never_removes_another_runs_staging(tmp_path: Path) -> None:
    """A snapshot run a left waiting for its upload survives run b's start-up cleanup, and
    is queued again when a starts."""
    state = tmp_path / "state"
    a = RunIdentity("a", tmp_path / "out-a")
    b = RunIdentity("b", tmp_path / "out-b")

    async def main() -> None:
        store = MemoryBackend("a")
        ja = Journal.in_state_dir(state, a)
        try:
            streamer_a = Streamer("a", state, store, ja)
            write_checkpoint(a.output_dir, 4)
            await streamer_a.stage("checkpoint-4", 4, a.output_dir / "checkpoint-4")
            await ja.set_state("checkpoint-4", "ready")  # the daemon stopped before its upload
        finally:
            ja.close()
        jb = Journal.in_state_dir(state, b)
        try:
            streamer_b = Streamer("b", state, store, jb)
            assert await recovery.recover(streamer_b, jb, []) == ([], [])
            assert streamer_b.queued == 0
        finally:
            jb.close()
        assert (streamer_a.staging / "checkpoint-4" / "trainer_state.json").is_file()
        ja = Journal.in_state_dir(state, a)
        try:
            streamer_a = Streamer("a", state, store, ja)
            await recovery.recover(streamer_a, ja, [])
            assert streamer_a.queued == 1
            await asyncio.wait_for(streamer_a.commit("checkpoint-4"), timeout=30)
        finally:
            ja.close()
        assert "checkpoint-4" in store.manifest_by_tag

    asyncio.run(main())


def test_another_runs_snapshot_does_not_ack_this_runs_trainer(tmp_path: Path) -> None:
    """A snapshot of run b (``traind push`` of the same tag, say) is not an ack for run a's
    trainer, which would then rotate its own checkpoint away before it is snapshot."""
    state = tmp_path / "state"
    a = RunIdentity("a", tmp_path / "out-a")
    b = RunIdentity("b", tmp_path / "out-b")

    async def main() -> None:
        ja, jb = Journal.in_state_dir(state, a), Journal.in_state_dir(state, b)
        try:
            streamer_a = Streamer("a", state, MemoryBackend("a"), ja)
            streamer_b = Streamer("b", state, MemoryBackend("b"), jb)
            write_checkpoint(b.output_dir, 5)
            await streamer_b.stage("checkpoint-5", 5, b.output_dir / "checkpoint-5")
            assert (streamer_b.acks / "checkpoint-5").exists()
            assert not (streamer_a.acks / "checkpoint-5").exists()
        finally:
            ja.close()
            jb.close()

    asyncio.run(main())


def test_resume_point_and_retention_see_only_this_runs_records(tmp_path: Path) -> None:
    """Another run on the same state_dir neither resumes from run a's newest checkpoint
    (same name: a's weights restored into its own output_dir) nor prunes a's local copies
    (same output_dir: a's records are not its commits)."""
    state = tmp_path / "state"
    a = RunIdentity("exp", tmp_path / "out-a")
    same_name = RunIdentity("exp", tmp_path / "out-b")
    same_dir = RunIdentity("other", a.output_dir)
    config = CheckpointsConfig()

    async def main() -> None:
        store = MemoryBackend("exp")
        ja = Journal.in_state_dir(state, a)
        try:
            streamer_a = Streamer("exp", state, store, ja)
            for step in (1, 2):
                tag = f"checkpoint-{step}"
                write_checkpoint(a.output_dir, step)
                await streamer_a.stage(tag, step, a.output_dir / tag)
                await ja.set_state(tag, "ready")
                await asyncio.wait_for(streamer_a.commit(tag), timeout=30)
        finally:
            ja.close()
        same_name.output_dir.mkdir()
        for other in (same_name, same_dir):
            journal = Journal.in_state_dir(state, other)
            try:
                assert await recovery.resume_point(store, journal, other.output_dir,
                                                   config) is None
                await pruner.prune(store, journal, RetentionConfig(keep_local=1),
                                   other.output_dir, config.pattern)
            finally:
                journal.close()
        assert list(same_name.output_dir.iterdir()) == []
        assert sorted(p.name for p in a.output_dir.iterdir()) == ["checkpoint-1", "checkpoint-2"]

    asyncio.run(main())

"""What wakes the watcher: inotify on output_dir and its checkpoint trees, and nothing else
between the timed scans (an idle daemon spends no CPU looking)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from asyncinotify import Inotify, Mask, Watch
from structlog.testing import capture_logs
from traind.checkpoints.intake import wakeups as changes_module
from traind.checkpoints.intake import watcher as watcher_module
from traind.checkpoints.intake.watcher import StageResult, Watcher

from traind.config import CheckpointsConfig

QUIET = CheckpointsConfig(poll_interval=3600.0)
"""Timed scans too rare to matter: whatever is seen was woken by the kernel."""


class Scans:
    """Counts the watcher's passes over output_dir (each lists it once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        listing = watcher_module.listing

        def counting(output_dir: Path, pattern: str) -> tuple[dict[str, int], dict[str, str]]:
            self.count += 1
            return listing(output_dir, pattern)

        monkeypatch.setattr(watcher_module, "listing", counting)

    async def after(self, action: Callable[[], object], seconds: float) -> int:
        """Scans during the ``seconds`` after ``action``."""
        before = self.count
        action()
        await asyncio.sleep(seconds)
        return self.count - before


async def on_complete(tag: str, step: int) -> None:
    return None


def watching(
    config: CheckpointsConfig, root: Path, test: Callable[[asyncio.Event], Awaitable[None]]
) -> None:
    """Run a watcher over ``root`` while ``test(staged)`` runs; ``staged`` is set on the
    first snapshot."""
    staged = asyncio.Event()

    async def on_stage(tag: str, step: int, path: Path) -> StageResult:
        staged.set()
        return StageResult.STAGED

    async def main() -> None:
        stop = asyncio.Event()
        watcher = Watcher(config, root, on_stage, on_complete, set())
        task = asyncio.create_task(watcher.run(stop))
        try:
            await asyncio.sleep(0.3)  # the start-up scan, and the watches in place
            await test(staged)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    asyncio.run(asyncio.wait_for(main(), 60))


def found_by_timed_scans(root: Path, tag: str, config: CheckpointsConfig) -> list[dict[str, Any]]:
    """Write checkpoint ``tag`` under a running watcher and wait for its snapshot; the
    events logged meanwhile."""

    async def test(staged: asyncio.Event) -> None:
        (root / tag).mkdir()
        (root / tag / "trainer_state.json").write_text("{}")
        await asyncio.wait_for(staged.wait(), 30)

    with capture_logs() as logs:
        watching(config, root, test)
    return logs


def test_an_idle_watcher_looks_only_when_its_timer_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing changing, and while the trainer writes logs beside the checkpoints, the
    watcher makes no pass but its timed ones."""
    scans = Scans(monkeypatch)
    (tmp_path / "runs").mkdir()

    def write_logs() -> None:
        for i in range(20):
            (tmp_path / "runs" / f"events-{i}").write_bytes(b"x")
            (tmp_path / "runs" / f"events-{i}").write_bytes(b"xy")

    async def test(staged: asyncio.Event) -> None:
        assert await scans.after(lambda: None, 1.0) == 0
        assert await scans.after(write_logs, 1.0) == 0

    watching(QUIET, tmp_path, test)


def test_a_checkpoint_written_later_is_seen_at_once(tmp_path: Path) -> None:
    """A checkpoint saved after start-up is staged long before the next timed scan."""

    async def test(staged: asyncio.Event) -> None:
        (tmp_path / "checkpoint-1").mkdir()
        (tmp_path / "checkpoint-1" / "model.safetensors").write_bytes(b"w" * 1024)
        (tmp_path / "checkpoint-1" / "trainer_state.json").write_text("{}")
        await asyncio.wait_for(staged.wait(), 10)

    watching(QUIET, tmp_path, test)


def test_a_marker_deep_in_directories_made_at_once_is_seen(tmp_path: Path) -> None:
    """Directories made in one go inside a checkpoint (``mkdir -p``, before a watch could be
    put on each) are watched too: a marker written at the bottom wakes the watcher."""
    config = QUIET.model_copy(update={"markers": ("model/shards/rank0/.metadata",)})

    async def test(staged: asyncio.Event) -> None:
        deep = tmp_path / "checkpoint-1" / "model" / "shards" / "rank0"
        deep.mkdir(parents=True)
        await asyncio.sleep(0.2)
        (deep / "__0_0.distcp").write_bytes(b"w")
        (deep / ".metadata").write_bytes(b"m")
        await asyncio.wait_for(staged.wait(), 10)

    watching(config, tmp_path, test)


def test_a_checkpoint_renamed_into_place_is_seen(tmp_path: Path) -> None:
    """A checkpoint written under another name and renamed to ``checkpoint-N`` (a save that
    publishes atomically) is staged at once, and changes inside it wake the watcher."""

    async def test(staged: asyncio.Event) -> None:
        tmp = tmp_path / "tmp-checkpoint-1"
        (tmp / "sub").mkdir(parents=True)
        (tmp / "model.safetensors").write_bytes(b"w")
        tmp.rename(tmp_path / "checkpoint-1")
        await asyncio.sleep(0.2)
        (tmp_path / "checkpoint-1" / "sub" / "trainer_state.json").write_text("{}")
        (tmp_path / "checkpoint-1" / "trainer_state.json").write_text("{}")
        await asyncio.wait_for(staged.wait(), 10)

    watching(QUIET, tmp_path, test)


def test_an_output_dir_removed_and_made_again_is_watched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After output_dir is deleted and made again, the next timed pass watches it anew:
    writes inside a checkpoint wake the watcher between timed passes again."""
    scans = Scans(monkeypatch)
    root = tmp_path / "out"
    config = CheckpointsConfig(poll_interval=1.0)

    def write_burst() -> None:
        (root / "checkpoint-1").mkdir()

    async def test(staged: asyncio.Event) -> None:
        shutil.rmtree(root)
        root.mkdir()
        await asyncio.sleep(2.5)  # a timed pass or two: it is watched again
        assert await scans.after(write_burst, 0.3) >= 1
        for i in range(5):
            (root / "checkpoint-1" / f"f{i}").write_bytes(b"x")
            assert await scans.after(lambda: None, 0.3) >= 1, f"no pass after write {i}"

    root.mkdir()
    watching(config, root, test)


def test_at_the_watch_limit_timed_scans_carry_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the kernel refuses a watch (fs.inotify.max_user_watches reached), the daemon
    says so once and finds checkpoints with its timed scans."""
    add_watch = Inotify.add_watch
    (tmp_path / "checkpoint-1").mkdir()

    def limited(self: Inotify, path: os.PathLike[str], mask: Mask) -> Watch:
        if Path(path) != tmp_path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return add_watch(self, path, mask)

    monkeypatch.setattr(Inotify, "add_watch", limited)
    logs = found_by_timed_scans(tmp_path, "checkpoint-2", CheckpointsConfig(poll_interval=0.2))
    limits = [e for e in logs if e["event"] == "checkpoint_watch_limit"]
    assert len(limits) == 1
    assert "max_user_watches" in limits[0]["hint"]


def test_without_an_inotify_instance_timed_scans_carry_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When inotify cannot be had (fs.inotify.max_user_instances reached, as on a busy
    Kubernetes node), the daemon says so and finds checkpoints with its timed scans."""

    def refused(**_: object) -> Inotify:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(changes_module, "Inotify", refused)
    logs = found_by_timed_scans(tmp_path, "checkpoint-1", CheckpointsConfig(poll_interval=0.2))
    (refusal,) = [e for e in logs if e["event"] == "checkpoint_watch_unavailable"]
    assert "Too many open files" in refusal["error"]


def test_force_polling_still_finds_new_checkpoints(tmp_path: Path) -> None:
    """With force_polling (no inotify, as on NFS) a checkpoint written after start-up is
    found by the timed scans."""
    found_by_timed_scans(tmp_path, "checkpoint-1",
                         CheckpointsConfig(poll_interval=0.1, force_polling=True))

"""The watcher's waiting thread: it looks for changes rarely while output_dir is quiet and
every millisecond while changes keep coming (a rotating trainer deletes checkpoints fast)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from traind.checkpoints.watcher import StageResult, Watcher
from traind.config import CheckpointsConfig


class CountingEvent(asyncio.Event):
    """A stop event that counts how often a thread other than the event loop's asks it:
    watchfiles' waiting thread asks once per step."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self._loop_thread = threading.get_ident()

    def is_set(self) -> bool:
        if threading.get_ident() != self._loop_thread:
            self.asked += 1
        return super().is_set()


async def on_complete(tag: str, step: int) -> None:
    return None


def watcher(config: CheckpointsConfig, root: Path, staged: asyncio.Event | None = None) -> Watcher:
    async def on_stage(tag: str, step: int, path: Path) -> StageResult:
        if staged is not None:
            staged.set()
        return StageResult.STAGED

    return Watcher(config, root, on_stage, on_complete, set())


async def asked_during(stop: CountingEvent, seconds: float) -> float:
    """How many times a second the waiting thread looked over the next ``seconds``."""
    before, started = stop.asked, time.monotonic()
    await asyncio.sleep(seconds)
    return (stop.asked - before) / (time.monotonic() - started)


def test_an_idle_watcher_looks_for_changes_rarely(tmp_path: Path) -> None:
    """With nothing changing in output_dir, watchfiles' thread wakes tens of times a second,
    not a thousand (a step of 1 ms cost an idle daemon ~1.4% of a core)."""

    async def main() -> float:
        stop = CountingEvent()
        task = asyncio.create_task(watcher(CheckpointsConfig(), tmp_path).run(stop))
        await asyncio.sleep(0.5)  # the start-up scan
        rate = await asked_during(stop, 2.0)
        stop.set()
        await asyncio.wait_for(task, 30)
        return rate

    rate = asyncio.run(asyncio.wait_for(main(), 60))
    assert rate < 100, f"the waiting thread woke {rate:.0f} times a second with nothing to do"


def test_changes_keep_it_looking_every_millisecond_then_it_cools(tmp_path: Path) -> None:
    """While files keep changing, the thread looks far more often than when quiet, and a
    whole quiet poll_interval later it is back to looking rarely; changes still wake a scan."""
    config = CheckpointsConfig(poll_interval=0.3)
    staged = asyncio.Event()

    async def main() -> tuple[float, float]:
        stop = CountingEvent()
        task = asyncio.create_task(watcher(config, tmp_path, staged).run(stop))
        await asyncio.sleep(0.5)
        (tmp_path / "checkpoint-1").mkdir()

        async def keep_writing() -> None:
            for i in range(40):
                (tmp_path / "checkpoint-1" / f"shard-{i}").write_bytes(b"x")
                await asyncio.sleep(0.02)

        writing = asyncio.create_task(keep_writing())
        await asyncio.sleep(0.2)  # the first change is seen within two cold steps
        hot = await asked_during(stop, 0.5)
        await asyncio.wait_for(writing, 30)
        (tmp_path / "checkpoint-1" / "trainer_state.json").write_text("{}")
        await asyncio.wait_for(staged.wait(), 30)
        await asyncio.sleep(1.0)  # a quiet poll_interval and more
        cold = await asked_during(stop, 1.0)
        stop.set()
        await asyncio.wait_for(task, 30)
        return hot, cold

    hot, cold = asyncio.run(asyncio.wait_for(main(), 60))
    assert hot > 4 * cold, f"{hot:.0f} looks a second while writing, {cold:.0f} when quiet"
    assert cold < 100, f"{cold:.0f} looks a second once quiet again"


def test_force_polling_still_finds_new_checkpoints(tmp_path: Path) -> None:
    """With force_polling (no inotify, as on NFS) a checkpoint written after start-up is
    found by the polling watcher."""
    config = CheckpointsConfig(poll_interval=0.1, force_polling=True)
    staged = asyncio.Event()

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(watcher(config, tmp_path, staged).run(stop))
        await asyncio.sleep(0.3)
        (tmp_path / "checkpoint-1").mkdir()
        (tmp_path / "checkpoint-1" / "trainer_state.json").write_text("{}")
        await asyncio.wait_for(staged.wait(), 30)
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(asyncio.wait_for(main(), 60))

"""The watcher's passes over a real output_dir: a final scan never interleaves with the
running watcher's scan."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.support.checkpoints import write_checkpoint
from traind.checkpoints.intake.watcher import StageResult, Watcher

from traind.config import CheckpointsConfig


async def test_a_final_scan_waits_for_the_scan_under_way(tmp_path: Path) -> None:
    """A final scan asked for while the running watcher snapshots a checkpoint waits for
    that pass: the checkpoint is snapshot once and handed on once."""
    out = tmp_path / "out"
    write_checkpoint(out, 1)
    gate, staging = asyncio.Event(), asyncio.Event()
    stages: list[str] = []
    completed: list[str] = []

    async def on_stage(tag: str, step: int, source: Path) -> StageResult:
        stages.append(tag)
        staging.set()
        await gate.wait()
        return StageResult.STAGED

    async def on_complete(tag: str, step: int) -> None:
        completed.append(tag)

    config = CheckpointsConfig(settle=3600, poll_interval=0.2)
    watcher = Watcher(config, out, on_stage, on_complete, set())
    running = asyncio.create_task(watcher.run())
    try:
        async with asyncio.timeout(10):
            await staging.wait()  # the start-up scan is snapshotting checkpoint-1
            final = asyncio.create_task(watcher.final_scan(writer_gone=True))
            await asyncio.sleep(0.3)  # time enough to snapshot it a second time, wrongly
            gate.set()
            assert await final == []
    finally:
        gate.set()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            async with asyncio.timeout(10):
                await running
    assert stages == ["checkpoint-1"]
    assert completed == ["checkpoint-1"]

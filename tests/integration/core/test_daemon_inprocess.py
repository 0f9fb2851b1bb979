"""The daemon in-process with a fake store: what it does when the store misbehaves."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import write_checkpoint

from traind.app.daemon import Daemon
from traind.config import validate
from traind.errors import TraindError, TransientStorageError
from traind.layout.manifest import Manifest
from traind.layout.markers import EXPLICIT_MARKER
from traind.protocol.testing import MemoryBackend


class FlakyStore(MemoryBackend):
    """A memory store whose first ``failures`` listings fail as if the network were down."""

    def __init__(self, failures: int) -> None:
        super().__init__("r")
        self.failures = failures
        self.listings = 0

    async def manifests(self) -> list[Manifest]:
        self.listings += 1
        if self.listings <= self.failures:
            raise TransientStorageError("store unreachable (test)")
        return await super().manifests()


async def running(daemon: Daemon, stop: asyncio.Event) -> asyncio.Task[None]:
    """Start ``daemon`` until ``stop``; return its task once it is running."""
    task = asyncio.create_task(daemon.run(stop))
    async with asyncio.timeout(20):
        while daemon.observer.state != "running":
            assert not task.done()
            await asyncio.sleep(0.05)
    return task


async def test_unreachable_store_at_startup_is_waited_for(tmp_path: Path) -> None:
    """A store that is down at start-up delays the start instead of ending the daemon."""
    settings = validate(
        {
            "run": {
                "name": "r",
                "output_dir": str(tmp_path / "out"),
                "state_dir": str(tmp_path / "state"),
            },
            "storage": {"type": "local", "path": str(tmp_path / "unused")},
            "status": {"enabled": False},
        }
    )
    store = FlakyStore(failures=2)
    daemon = await Daemon.open(settings, storage=store)
    stop = asyncio.Event()
    task = await running(daemon, stop)
    assert store.listings >= 3
    stop.set()
    async with asyncio.timeout(20):
        await task


async def test_without_a_trainer_only_the_explicit_marker_completes_at_stop(
    tmp_path: Path,
) -> None:
    """Watching a trainer it does not run, a stopping daemon commits a checkpoint that
    carries traind's explicit marker, and names one that did not settle within
    ``stop_timeout`` as unstored."""
    out = tmp_path / "out"
    settings = validate(
        {
            "run": {"name": "r", "output_dir": str(out), "state_dir": str(tmp_path / "state"),
                    "stop_timeout": "1s"},
            "checkpoints": {"settle": "1h", "poll_interval": "1s"},
            "storage": {"type": "local", "path": str(tmp_path / "unused")},
            "status": {"enabled": False},
        }
    )
    store = MemoryBackend("r")
    daemon = await Daemon.open(settings, storage=store)
    stop = asyncio.Event()
    task = await running(daemon, stop)
    write_checkpoint(out, 1)
    write_checkpoint(out, 2)
    (out / "checkpoint-1" / EXPLICIT_MARKER).touch()
    with capture_logs() as logs:
        stop.set()
        async with asyncio.timeout(20):
            await task
    assert sorted(store.manifest_by_tag) == ["checkpoint-1"]
    assert daemon.unstored == ["checkpoint-2"]
    waited = [e for e in logs if e["event"] == "checkpoints_settled_at_stop"]
    assert [e["unsettled"] for e in waited] == [["checkpoint-2"]]


async def test_open_refuses_a_second_daemon_until_the_first_one_ran(tmp_path: Path) -> None:
    """``Daemon.open`` refuses a second daemon on a state_dir another one holds, before it
    does anything; once the first one's run ended, the state_dir is free again."""
    settings = validate(
        {
            "run": {"name": "r", "output_dir": str(tmp_path / "out"),
                    "state_dir": str(tmp_path / "state")},
            "storage": {"type": "local", "path": str(tmp_path / "unused")},
            "status": {"enabled": False},
        }
    )
    stop = asyncio.Event()
    stop.set()
    first = await Daemon.open(settings, storage=MemoryBackend("r"))
    with pytest.raises(TraindError, match=rf"another traind \(pid {os.getpid()}\) is running"):
        await Daemon.open(settings, storage=MemoryBackend("r"))
    async with asyncio.timeout(20):
        await first.run(stop)
    second = await Daemon.open(settings, storage=MemoryBackend("r"))
    async with asyncio.timeout(20):
        await second.run(stop)

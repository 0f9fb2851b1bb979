"""A daemon whose task fails says so: its last line is an error naming what is unstored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import write_checkpoint
from tests.support.waits import until

from traind.app.daemon import Daemon
from traind.config import validate
from traind.errors import TransientStorageError
from traind.protocol.testing import MemoryBackend
from traind.storage import LocalFile, UploadSession


class DownStore(MemoryBackend):
    """A memory store whose uploads fail as if the network were down."""

    async def upload(self, tag: str, root: Path, files: list[LocalFile],  # type: ignore[override]
                     session: UploadSession) -> None:
        raise TransientStorageError("store unreachable (test)")


async def test_a_failed_task_ends_with_an_error_naming_the_unstored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With checkpoint-1 waiting for the store, a daemon task crashes: ``run`` raises it,
    and the last event is an error-level ``daemon_stopped`` naming checkpoint-1 and the
    failure, not a clean stop."""
    out = tmp_path / "out"
    settings = validate({
        "run": {"name": "r", "output_dir": str(out), "state_dir": str(tmp_path / "state")},
        "checkpoints": {"settle": "100ms", "poll_interval": "100ms"},
        "storage": {"type": "local", "path": str(tmp_path / "unused")},
        "status": {"enabled": False},
    })
    daemon = await Daemon.open(settings, storage=DownStore("r"))
    crash = asyncio.Event()

    async def crashing_retention() -> None:
        await crash.wait()
        raise RuntimeError("retention broke (test)")

    monkeypatch.setattr(daemon.pruning, "run", crashing_retention)
    with capture_logs() as logs:
        task = asyncio.create_task(daemon.run(asyncio.Event()))
        write_checkpoint(out, 1)
        await until(lambda: any(e["event"] == "checkpoint_upload_failed" for e in logs), 30)
        crash.set()
        with pytest.raises(BaseExceptionGroup) as failed:
            async with asyncio.timeout(30):
                await task
    assert failed.group_contains(RuntimeError, match="retention broke")
    last = logs[-1]
    assert last["event"] == "daemon_stopped"
    assert last["log_level"] == "error"
    assert last["unstored"] == ["checkpoint-1"]
    assert "retention broke" in last["error"]

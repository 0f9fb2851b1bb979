"""``exit_when_done``: the daemon ends after the trainer exits 0 only once every checkpoint
is committed, also one whose upload failed and waits for its retry."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from traind.app import Daemon
from traind.config import validate
from traind.errors import TransientStorageError
from traind.storage.base import LocalFile, UploadSession
from traind.storage.memory import MemoryBackend


class FailingStore(MemoryBackend):
    """A memory store whose first ``failures`` uploads fail as if the network dropped."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise TransientStorageError("connection reset (test)")
        await super().upload(tag, root, files, session)


async def test_the_daemon_waits_for_a_retried_upload_before_exiting(tmp_path: Path) -> None:
    """The trainer saves one checkpoint and exits 0; its first two uploads fail. The
    daemon ends by itself only after the third has committed it."""
    out = tmp_path / "out"
    save = (
        f"import os; d = os.path.join({str(out)!r}, 'checkpoint-1'); os.makedirs(d); "
        "open(os.path.join(d, 'w.bin'), 'wb').write(b'w' * 1000); "
        "open(os.path.join(d, 'trainer_state.json'), 'w').write('{}')"
    )
    settings = validate({
        "run": {"name": "r", "output_dir": str(out), "state_dir": str(tmp_path / "state")},
        "storage": {"type": "local", "path": str(tmp_path / "unused")},
        "checkpoints": {"settle": "0.2s", "poll_interval": "0.1s"},
        "status": {"enabled": False},
        "trainer": {"command": [sys.executable, "-c", save]},
    })
    store = FailingStore(failures=2)  # retried after 1 s, then 2 s
    stop = asyncio.Event()
    async with asyncio.timeout(60):
        await Daemon(settings, storage=store).run(stop)
    assert stop.is_set()  # it ended by itself, run complete
    assert list(store.manifest_by_tag) == ["checkpoint-1"]
    assert store.failures == 0

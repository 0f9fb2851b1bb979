"""The streamer over the in-memory store: ``exit_when_done`` and shutdown wait for it to be
idle (every checkpoint committed, also one whose upload failed and waits for its retry).
Its step table is tested in test_lifecycle.py; the streamer with real stores and a real
daemon in tests/integration/ (core/, run/, multinode/) and tests/conformance/."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from tests.support.checkpoints import run_in, write_checkpoint

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.state.journal import Journal
from traind.errors import TransientStorageError
from traind.protocol.testing import MemoryBackend
from traind.storage import LocalFile, UploadSession


class FailingStore(MemoryBackend):
    """A memory store whose first ``failures`` uploads fail as if the network dropped."""

    def __init__(self, failures: int) -> None:
        super().__init__("r")
        self.failures = failures

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise TransientStorageError("connection reset (test)")
        await super().upload(tag, root, files, session)


@contextlib.asynccontextmanager
async def handed_one(
    tmp_path: Path, store: FailingStore, retry_initial: float
) -> AsyncIterator[tuple[Streamer, asyncio.Task[None]]]:
    """A running streamer handed checkpoint-1 (staged and complete) for ``store``; the
    streamer and its upload loop, cancelled and the journal closed afterwards."""
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    streamer = Streamer("r", tmp_path / "state", store, journal, retry_initial=retry_initial)
    write_checkpoint(tmp_path / "out", 1)
    running = asyncio.create_task(streamer.run())
    try:
        await streamer.stage("checkpoint-1", 1, tmp_path / "out" / "checkpoint-1")
        await streamer.complete("checkpoint-1", 1)
        yield streamer, running
    finally:
        running.cancel()
        journal.close()


async def test_idle_waits_for_a_retried_upload(tmp_path: Path) -> None:
    """A checkpoint whose first two uploads fail is still pending while it waits for its
    retries: ``wait_idle`` (what exit_when_done and shutdown wait on) returns only once it
    is committed."""
    store = FailingStore(failures=2)
    async with handed_one(tmp_path, store, retry_initial=0.2) as (streamer, _):
        async with asyncio.timeout(20):
            await streamer.wait_idle()
        assert list(store.manifest_by_tag) == ["checkpoint-1"]
        assert store.failures == 0
        assert streamer.pending == 0


async def test_retry_wait_is_a_task_of_the_upload_loop(tmp_path: Path) -> None:
    """A failed upload waits for its retry in a task the upload loop owns: cancelling the
    loop cancels the wait, and nothing is queued by a timer left behind."""
    async with handed_one(tmp_path, FailingStore(failures=1), retry_initial=0.5) as (
        streamer, running,
    ):
        async with asyncio.timeout(20):  # the first upload failed: its retry waits now
            while True:
                if _waiting_retry():
                    break
                await asyncio.sleep(0.01)
        running.cancel()
        async with asyncio.timeout(10):
            await asyncio.gather(running, return_exceptions=True)
        assert not _waiting_retry()
        await asyncio.sleep(1.0)  # past the retry's time: a bare timer would queue it now
        assert streamer.queued == 0
        assert streamer.unstored == ["checkpoint-1"]  # still pending, in the journal too


def _waiting_retry() -> bool:
    return any(t.get_name() == "again-checkpoint-1" for t in asyncio.all_tasks())

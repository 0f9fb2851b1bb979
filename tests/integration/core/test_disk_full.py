"""A full disk (a real tmpfs) never stops the daemon: journal writes wait for space, and a
failed snapshot ack is reported, not fatal."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from structlog.testing import capture_logs
from tests.support.checkpoints import run_in, write_checkpoint
from tests.support.tmpfs import fill, tmpfs

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.restore import recovery
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.checkpoints.state.space import SpaceGuard
from traind.errors import TransientStorageError
from traind.layout.manifest import Manifest
from traind.protocol.testing import MemoryBackend
from traind.storage import LocalFile, UploadSession


async def test_journal_write_waits_for_space(tmp_path: Path) -> None:
    """A journal write that fails with "database or disk is full" is retried, logged once
    at error level, and succeeds once space is back."""
    with tmpfs(tmp_path / "fs", "1m") as fs:
        journal = Journal(fs / "state" / "journal.sqlite3", run_in(tmp_path), retry_initial=0.05,
                          retry_max=0.2)
        try:
            ballast = fill(fs)
            files = [LocalFile(f"shard-{i:05d}-{'x' * 60}.bin", i) for i in range(3000)]
            with capture_logs() as logs:
                write = asyncio.create_task(
                    journal.staged("checkpoint-1", 1, tmp_path / "out", files)
                )
                async with asyncio.timeout(30):
                    while not any(e["event"] == "journal_write_failed" for e in logs):
                        if write.done():
                            write.result()  # the old journal raised here
                        await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)  # several retries fail meanwhile
                assert not write.done()
                ballast.unlink()
                async with asyncio.timeout(30):
                    await write
            failed = [e for e in logs if e["event"] == "journal_write_failed"]
            assert len(failed) == 1
            assert failed[0]["log_level"] == "error"
            assert "full" in failed[0]["error"] or "I/O" in failed[0]["error"]
            recovered = [e for e in logs if e["event"] == "journal_write_recovered"]
            assert len(recovered) == 1
            assert recovered[0]["attempts"] >= 2
            entry = await journal.get("checkpoint-1")
            assert entry is not None
            assert entry.state == "staged"
            assert len(await journal.files("checkpoint-1")) == 3000
            await journal.set_state("checkpoint-1", "ready")  # later writes work as before
        finally:
            journal.close()


async def test_failed_ack_is_reported_not_fatal(tmp_path: Path) -> None:
    """A snapshot whose ack to the trainer's callback cannot be written still counts as
    staged; the failure is an error event, never an exception out of the watcher."""
    state = tmp_path / "state"
    journal = Journal.in_state_dir(state, run_in(tmp_path))
    streamer = Streamer("r", state, MemoryBackend("r"), journal)
    (state / "acks").write_text("a file where the ack directory belongs")
    write_checkpoint(tmp_path / "out", 1)
    try:
        with capture_logs() as logs:
            result = await streamer.stage("checkpoint-1", 1, tmp_path / "out" / "checkpoint-1")
        assert result is StageResult.STAGED
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["checkpoint_ack_failed"]
    finally:
        journal.close()


async def until(check: Callable[[], bool], within: float = 20.0) -> None:
    """Poll ``check`` until it holds, for at most ``within`` seconds."""
    async with asyncio.timeout(within):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


class DownStore(MemoryBackend):
    """A memory store that fails every upload while ``down``."""

    down = True

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        if self.down:
            raise TransientStorageError("connection refused (test)")
        await super().upload(tag, root, files, session)


async def test_dropped_snapshot_is_never_uploaded(tmp_path: Path) -> None:
    """A dropped checkpoint waiting for its retry is no longer pending, is never uploaded
    once the store is back, and a restarted daemon neither uploads nor tracks it."""
    state, out = tmp_path / "state", tmp_path / "out"
    store = DownStore("r")
    journal = Journal.in_state_dir(state, run_in(tmp_path))
    streamer = Streamer("r", state, store, journal, retry_initial=0.2, retry_max=0.2)
    running = asyncio.create_task(streamer.run())
    try:
        for step in (1, 2):
            write_checkpoint(out, step)
            await streamer.stage(f"checkpoint-{step}", step, out / f"checkpoint-{step}")
            await streamer.complete(f"checkpoint-{step}", step)
        await until(lambda: streamer.in_flight is None)  # failed, waiting for its retry
        await streamer.drop("checkpoint-1")
        assert streamer.pending == 1
        assert not (streamer.staging / "checkpoint-1").exists()
        store.down = False
        async with asyncio.timeout(20):
            await streamer.wait_idle()
        assert list(store.manifest_by_tag) == ["checkpoint-2"]
        entry = await journal.get("checkpoint-1")
        assert entry is not None
        assert entry.state == "dropped"
    finally:
        running.cancel()
    again = Streamer("r", state, store, journal)
    assert await recovery.recover(again, journal, list(store.manifest_by_tag.values())) == ([], [])
    assert again.pending == 0
    journal.close()


async def test_staging_on_another_filesystem_is_never_dropped(tmp_path: Path) -> None:
    """With state_dir on another filesystem, snapshots are copies that take no space on
    output_dir's: a full output_dir drops none of them (it would free nothing) and says
    once that nothing can be dropped."""
    with tmpfs(tmp_path / "out", "2m") as out, tmpfs(tmp_path / "state", "4m") as state:
        journal = Journal.in_state_dir(state, run_in(tmp_path))
        streamer = Streamer("r", state, MemoryBackend("r"), journal)
        guard = SpaceGuard(out, streamer, journal, (1.0, 0))
        try:
            for step in (1, 2, 3):
                write_checkpoint(out, step, size=128 * 1024)
                await streamer.stage(f"checkpoint-{step}", step, out / f"checkpoint-{step}")
                await journal.set_state(f"checkpoint-{step}", "ready")
                shutil.rmtree(out / f"checkpoint-{step}")
            guard.staged(2 * 128 * 1024)
            fill(out)
            with capture_logs() as logs:
                assert await guard.check() == []
                assert await guard.check() == []
            assert [e["event"] for e in logs] == ["disk_space_low"]
            assert [e.state for e in await journal.entries()] == ["ready"] * 3
        finally:
            journal.close()


async def test_store_back_on_a_full_disk_commits_the_newest_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    """With the disk full to the last byte when the store returns, the journal's reserve
    lets the daemon record: the newest checkpoint is committed first, and the older ones
    are dropped with one error naming them."""
    with tmpfs(tmp_path / "fs", "4m") as fs:
        out, state = fs / "out", fs / "state"
        store = DownStore("r")
        journal = Journal.in_state_dir(state, RunIdentity("r", out))
        streamer = Streamer("r", state, store, journal, retry_initial=0.1, retry_max=0.2)
        guard = SpaceGuard(out, streamer, journal, (1.5, 0))

        async def committed(manifest: Manifest) -> None:
            await guard.committed(manifest.step)

        streamer.committer.on_commit = committed
        running = asyncio.create_task(streamer.run())
        try:
            with capture_logs() as logs:
                for step in (1, 2, 3):  # the trainer keeps all three: none can be let go
                    write_checkpoint(out, step, size=256 * 1024)
                    await streamer.stage(f"checkpoint-{step}", step, out / f"checkpoint-{step}")
                    await streamer.complete(f"checkpoint-{step}", step)
                fill(fs)
                await guard.check()
                assert guard.full
                store.down = False
                async with asyncio.timeout(30):
                    await streamer.wait_idle()
            assert list(store.manifest_by_tag) == ["checkpoint-3"]
            assert [e.state for e in await journal.entries()] == ["dropped", "dropped",
                                                                   "committed"]
            dropped = [e for e in logs if e["event"] == "checkpoints_dropped_full_disk"]
            assert [e["tags"] for e in dropped] == [["checkpoint-2", "checkpoint-1"]]
            assert dropped[0]["log_level"] == "error"
            assert not [e for e in logs if e["event"] == "journal_write_failed"]
            assert shutil.disk_usage(fs).free < 64 * 1024  # the disk stayed full throughout
        finally:
            running.cancel()
            journal.close()


class HangingStore(MemoryBackend):
    """A memory store whose uploads hang (a store gone without refusing connections)."""

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        await asyncio.sleep(3600)


async def test_the_snapshot_in_flight_is_dropped_by_stopping_its_upload(tmp_path: Path) -> None:
    """Dropping the checkpoint whose upload hangs stops that upload: it is journalled
    dropped, its staging is gone, and the upload loop goes on with the next one."""
    state, out = tmp_path / "state", tmp_path / "out"
    journal = Journal.in_state_dir(state, run_in(tmp_path))
    streamer = Streamer("r", state, HangingStore("r"), journal)
    running = asyncio.create_task(streamer.run())
    try:
        for step in (1, 2):
            write_checkpoint(out, step)
            await streamer.stage(f"checkpoint-{step}", step, out / f"checkpoint-{step}")
            await streamer.complete(f"checkpoint-{step}", step)
        await until(lambda: streamer.in_flight == "checkpoint-1")
        async with asyncio.timeout(10):
            await streamer.drop("checkpoint-1")
        await until(lambda: streamer.in_flight == "checkpoint-2")
        entry = await journal.get("checkpoint-1")
        assert entry is not None
        assert entry.state == "dropped"
        assert not (streamer.staging / "checkpoint-1").exists()
        assert streamer.unstored == ["checkpoint-2"]
    finally:
        running.cancel()
        journal.close()


class SlowToStopStore(MemoryBackend):
    """A memory store whose uploads hang, and take a while to stop when cancelled (a
    transfer thread finishing its part)."""

    def __init__(self, run: str) -> None:
        super().__init__(run)
        self.started = asyncio.Event()
        """Set once an upload is in the store's transfer."""

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.shield(asyncio.sleep(0.5))


async def test_a_full_disk_while_a_dropped_upload_still_stops(tmp_path: Path) -> None:
    """The disk filling up after the only pending checkpoint was dropped, while its
    upload is still stopping, neither raises nor holds back the next checkpoint."""
    state, out = tmp_path / "state", tmp_path / "out"
    journal = Journal.in_state_dir(state, run_in(tmp_path))
    store = SlowToStopStore("r")
    streamer = Streamer("r", state, store, journal)
    running = asyncio.create_task(streamer.run())
    try:
        write_checkpoint(out, 1)
        await streamer.stage("checkpoint-1", 1, out / "checkpoint-1")
        await streamer.complete("checkpoint-1", 1)
        await until(store.started.is_set)  # in the store's transfer, not still claiming
        await streamer.drop("checkpoint-1")
        assert streamer.unstored == []
        assert streamer.in_flight == "checkpoint-1"
        streamer.newest_only(True)
        await until(lambda: streamer.in_flight is None)
        write_checkpoint(out, 2)
        await streamer.stage("checkpoint-2", 2, out / "checkpoint-2")
        await streamer.complete("checkpoint-2", 2)
        await until(lambda: streamer.in_flight == "checkpoint-2")  # the newest: not held back
        assert not running.done()
    finally:
        running.cancel()
        journal.close()

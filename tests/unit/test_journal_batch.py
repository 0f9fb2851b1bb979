"""Files finishing together are recorded in one journal transaction, each durably before
its ``file_done`` returns, and a cancelled caller never loses another's record."""

from __future__ import annotations

import asyncio
from pathlib import Path

from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal, StagedFile

TAG = "checkpoint-1"
FILES = 200


def journal_with_files(tmp_path: Path) -> Journal:
    return Journal.in_state_dir(tmp_path / "state", RunIdentity("r", tmp_path / "out", "x"))


async def stage(journal: Journal) -> None:
    files = [StagedFile(f"f{i}", 1, 1) for i in range(FILES)]
    await journal.staged(TAG, 1, Path("/out") / TAG, files)


def test_files_finishing_together_share_a_transaction(tmp_path: Path) -> None:
    """Concurrent file_done calls commit in a few transactions, not one each, and every
    record is in the database (read by a fresh connection) once its call returns."""
    journal = journal_with_files(tmp_path)
    commits: list[str] = []

    async def main() -> None:
        await stage(journal)
        journal._db.set_trace_callback(
            lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        await asyncio.wait_for(asyncio.gather(
            *(journal.file_done(TAG, f"f{i}", f"{i:064x}") for i in range(FILES))), 30)

    try:
        asyncio.run(main())
    finally:
        journal.close()
    assert len(commits) <= 5, f"{len(commits)} transactions for {FILES} files"
    fresh = journal_with_files(tmp_path)
    try:
        stored = {f.path: f.sha256 for f in fresh.files_sync(TAG)}
    finally:
        fresh.close()
    assert stored == {f"f{i}": f"{i:064x}" for i in range(FILES)}


def test_a_cancelled_caller_does_not_lose_the_others_records(tmp_path: Path) -> None:
    """The caller writing a shared transaction is cancelled: every other caller's record
    of it is still written before its file_done returns."""
    journal = journal_with_files(tmp_path)
    fresh = journal_with_files(tmp_path)

    async def main() -> None:
        await stage(journal)
        first = asyncio.create_task(journal.file_done(TAG, "f0", "00" * 32))
        await asyncio.sleep(0)  # it writes a transaction of its own
        batch = [asyncio.create_task(journal.file_done(TAG, f"f{i}", f"{i:064x}"))
                 for i in range(1, FILES)]
        await asyncio.sleep(0)  # all waiting for the next transaction
        await asyncio.wait_for(first, 30)
        for _ in range(1000):  # until batch[0] has taken the others' records to write
            if journal._done_batch is None:
                break
            await asyncio.sleep(0)
        assert journal._done_batch is None
        batch[0].cancel()
        await asyncio.wait_for(batch[1], 30)
        # At once, through another connection: the record is durable when file_done returns.
        stored = {f.path: f.sha256 for f in fresh.files_sync(TAG)}
        assert {f"f{i}": stored[f"f{i}"] for i in range(2, FILES)} == {
            f"f{i}": f"{i:064x}" for i in range(2, FILES)}
        await asyncio.wait_for(asyncio.gather(*batch[2:]), 30)

    try:
        asyncio.run(main())
    finally:
        journal.close()
        fresh.close()

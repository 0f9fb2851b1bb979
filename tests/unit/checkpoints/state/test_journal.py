"""The journal keeps each run's records apart, and reports SQLite's errors as its own."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal, StagedFile
from traind.errors import JournalError, TraindError
from traind.storage import LocalFile

STORE_A = "local:/store/a"


def runs(tmp_path: Path) -> tuple[RunIdentity, RunIdentity]:
    return (
        RunIdentity("a", tmp_path / "out-a"),
        RunIdentity("b", tmp_path / "out-b"),
    )


def test_runs_sharing_a_journal_see_only_their_own_records(tmp_path: Path) -> None:
    """Run b neither sees nor changes run a's records of the same tags."""
    a, b = runs(tmp_path)

    async def main() -> None:
        ja = Journal.in_state_dir(tmp_path / "state", a)
        jb = Journal.in_state_dir(tmp_path / "state", b)
        try:
            tag = "checkpoint-1"
            await ja.staged(tag, 1, a.output_dir / tag, [StagedFile("w.bin", 5, 7)])
            await ja.begin_upload(tag, STORE_A)
            await ja.save_resume(tag, "w.bin", "upload-id-a")
            await ja.file_done(tag, "w.bin", "aa" * 32)
            await ja.set_state(tag, "committed")
            await ja.save_resume("checkpoint-2", "x.bin", "upload-id-a2")
            assert await jb.get(tag) is None
            assert await jb.entries() == []
            assert await jb.resume_states() == []
            await jb.staged(tag, 1, b.output_dir / tag, [LocalFile("other.bin", 9)])
            await jb.set_state(tag, "ready")
            await jb.save_resume(tag, "other.bin", "upload-id-b")
            entry = await ja.get(tag)
            assert entry is not None
            assert (entry.state, entry.source, entry.backend) == (
                "committed", a.output_dir / tag, STORE_A
            )
            assert [(f.path, f.sha256) for f in await ja.files(tag)] == [("w.bin", "aa" * 32)]
            assert await ja.resume_states() == [("checkpoint-2", "x.bin", "upload-id-a2")]
            assert [(e.tag, e.state) for e in await jb.entries()] == [(tag, "ready")]
            assert [f.path for f in await jb.files(tag)] == ["other.bin"]
            assert await jb.load_resume(tag, "other.bin") == "upload-id-b"
        finally:
            ja.close()
            jb.close()

    asyncio.run(main())


def test_run_key_is_name_and_output_dir(tmp_path: Path) -> None:
    """The same name and output_dir is the same run (and journal); another name or
    output_dir is another run."""
    a, b = runs(tmp_path)
    assert RunIdentity("a", a.output_dir).key == a.key
    assert RunIdentity("a", b.output_dir).key != a.key
    assert RunIdentity("b", a.output_dir).key != a.key
    assert a.key.startswith("a-")


def test_sqlite_errors_are_journal_errors(tmp_path: Path) -> None:
    """SQLite's errors reach callers as JournalError (under TraindError) naming the database,
    with SQLite's code: opening a file that is not a database, and a write that fails."""
    a, _ = runs(tmp_path)
    bad = tmp_path / "bad" / "journal.sqlite3"
    bad.parent.mkdir()
    bad.write_bytes(b"not a database" * 512)
    with pytest.raises(JournalError) as caught:
        Journal(bad, a)
    assert isinstance(caught.value, TraindError)
    assert caught.value.code == "SQLITE_NOTADB"
    assert not caught.value.full
    assert str(bad) in str(caught.value)

    journal = Journal.in_state_dir(tmp_path / "state", a)
    try:
        db = sqlite3.connect(tmp_path / "state" / "journal.sqlite3")
        db.execute("DROP TABLE resume")
        db.commit()
        db.close()
        with pytest.raises(JournalError, match="no such table: resume") as failed:
            asyncio.run(journal.save_resume("checkpoint-1", "w.bin", "state"))
        assert failed.value.code == "SQLITE_ERROR"
    finally:
        journal.close()

"""The journal keeps each run's records apart, and migrates a journal written before runs
were kept without losing or wrongly claiming a row."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import OLD_JOURNAL_SCHEMA
from traind.checkpoints.state.identity import RunIdentity, staging_dir
from traind.checkpoints.state.journal import Journal, StagedFile

from traind.errors import JournalError, TraindError
from traind.storage import LocalFile

STORE_A = "local:/store/a"


def runs(tmp_path: Path) -> tuple[RunIdentity, RunIdentity]:
    return (
        RunIdentity("a", tmp_path / "out-a", STORE_A),
        RunIdentity("b", tmp_path / "out-b", "local:/store/b"),
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


def test_run_key_is_name_and_output_dir_not_the_store(tmp_path: Path) -> None:
    """A reload to another store keeps the run (and its journal); another name or output_dir
    is another run."""
    a, b = runs(tmp_path)
    assert RunIdentity("a", a.output_dir, "s3://ckpts/a/").key == a.key
    assert RunIdentity("a", b.output_dir, STORE_A).key != a.key
    assert RunIdentity("b", a.output_dir, STORE_A).key != a.key
    assert a.key.startswith("a-")


def write_old_journal(path: Path, out_a: Path, out_x: Path) -> None:
    """A journal as today's traind writes it: checkpoints of run a (one committed, one
    ready with a half-sent file, one stored to another store) and one of another run."""
    db = sqlite3.connect(path)
    db.executescript(OLD_JOURNAL_SCHEMA)
    rows = [
        ("checkpoint-1", 1, out_a / "checkpoint-1", "committed", STORE_A),
        ("checkpoint-2", 2, out_a / "checkpoint-2", "ready", None),
        ("checkpoint-3", 3, out_x / "checkpoint-3", "committed", "local:/store/x"),
        ("checkpoint-4", 4, out_a / "checkpoint-4", "committed", "s3://elsewhere/a/"),
    ]
    for tag, step, source, state, backend in rows:
        db.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)",
            (tag, step, str(source), state, backend, 1.0),
        )
        db.execute(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?)",
            (tag, "model.bin", 10 * step, f"{step:064x}" if state == "committed" else None, 5),
        )
    db.execute("INSERT INTO resume VALUES ('checkpoint-2', 'model.bin', 'upload-2')")
    db.commit()
    db.close()


def raw_rows(path: Path) -> dict[str, set[tuple[object, ...]]]:
    """Every row of every table, the run column left out."""
    db = sqlite3.connect(path)
    try:
        return {
            "checkpoints": set(db.execute(
                "SELECT tag, step, source, state, backend, updated_at FROM checkpoints")),
            "files": set(db.execute("SELECT tag, path, size, sha256, mtime_ns FROM files")),
            "resume": set(db.execute("SELECT tag, path, state FROM resume")),
        }
    finally:
        db.close()


def test_old_journal_is_migrated_and_claimed_only_by_its_run(tmp_path: Path) -> None:
    """Opened by run b first, a journal written by today's traind loses no row and gives b
    none; opened by run a, a gets exactly the rows from its output_dir and store (with their
    files, resume state and staging), and the rest stays for their own runs."""
    state = tmp_path / "state"
    state.mkdir()
    path = state / "journal.sqlite3"
    a, b = runs(tmp_path)
    write_old_journal(path, a.output_dir, tmp_path / "out-x")
    snapshot = state / "staging" / "checkpoint-2"
    snapshot.mkdir(parents=True)
    (snapshot / "model.bin").write_bytes(b"x" * 20)
    before = raw_rows(path)

    async def main() -> None:
        with capture_logs() as migrated:
            jb = Journal(path, b)
        try:
            assert await jb.entries() == []
            assert await jb.resume_states() == []
        finally:
            jb.close()
        assert raw_rows(path) == before
        assert snapshot.is_dir()
        with capture_logs() as claimed:
            ja = Journal(path, a)
        try:
            assert [(e.tag, e.state) for e in await ja.entries()] == [
                ("checkpoint-1", "committed"), ("checkpoint-2", "ready")
            ]
            assert [(f.path, f.sha256) for f in await ja.files("checkpoint-1")] == [
                ("model.bin", f"{1:064x}")
            ]
            assert await ja.resume_states() == [("checkpoint-2", "model.bin", "upload-2")]
        finally:
            ja.close()
        assert raw_rows(path) == before
        assert [e["event"] for e in migrated] == ["journal_migrated"]
        assert [(e["checkpoints"], e["pending"]) for e in claimed] == [(2, ["checkpoint-2"])]
        moved = staging_dir(state, a) / "checkpoint-2"
        assert (moved / "model.bin").read_bytes() == b"x" * 20
        assert not snapshot.exists()
        again = Journal(path, a)  # a second open migrates and claims nothing more
        try:
            assert len(await again.entries()) == 2
        finally:
            again.close()

    asyncio.run(main())
    db = sqlite3.connect(path)
    try:
        legacy = {tag for (tag,) in db.execute("SELECT tag FROM checkpoints WHERE run = ''")}
    finally:
        db.close()
    assert legacy == {"checkpoint-3", "checkpoint-4"}


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

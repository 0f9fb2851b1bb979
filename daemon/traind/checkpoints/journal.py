"""The journal: SQLite in ``state_dir`` recording each checkpoint's progress.

States: ``staged`` (snapshot taken, may still change) → ``ready`` (complete, queued) →
``committed`` (manifest stored) → ``pruning`` (its manifest may be gone from the store, its
files not yet) → ``pruned`` (removed from the store by retention); or ``ready`` →
``conflict`` (another writer holds the tag in the store: never retried, snapshot kept); or
``ready`` → ``dropped`` (its snapshot let go before it was stored, to keep the disk from
filling).
Per file it keeps its size and mtime when snapshot (a later rewrite by the trainer is told
apart), the sha256 once the file is durably stored, and opaque resume state for backends
that upload in parts. Every write is one transaction, fsynced, so a daemon killed
at any moment restarts from the last thing that really happened. A write that fails for
lack of space (or a disk I/O error) is retried with backoff until it succeeds: losing the
daemon would lose every checkpoint after it.

A journal is opened for one run (``RunIdentity``): every row carries its run's key, and
every query and write sees only that run's rows, so runs sharing a ``state_dir`` never skip,
resume from, prune or delete each other's checkpoints. Rows of a journal written before runs
were kept are migrated with an empty run, and claimed by the first run they provably belong
to (see ``_claim_legacy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

import structlog

from traind.checkpoints.state.identity import RunIdentity, staging_dir
from traind.checkpoints.state.reserve import Reserve
from traind.errors import JournalError
from traind.storage import LocalFile
from traind.util.retry import Backoff, retrying

State = Literal["staged", "ready", "committed", "pruning", "pruned", "conflict", "dropped"]
P = ParamSpec("P")
T = TypeVar("T")
log = structlog.get_logger("traind.journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    run TEXT NOT NULL,
    tag TEXT NOT NULL,
    step INTEGER NOT NULL,
    source TEXT NOT NULL,
    state TEXT NOT NULL,
    backend TEXT,
    updated_at REAL NOT NULL,
    PRIMARY KEY (run, tag)
);
CREATE TABLE IF NOT EXISTS files (
    run TEXT NOT NULL,
    tag TEXT NOT NULL,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT,
    mtime_ns INTEGER,
    PRIMARY KEY (run, tag, path)
);
CREATE TABLE IF NOT EXISTS resume (
    run TEXT NOT NULL,
    tag TEXT NOT NULL,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (run, tag, path)
);
"""
_LEGACY = ""
"""The run of rows migrated from a journal written before runs were kept, until claimed."""
_TABLES = ("checkpoints", "files", "resume")

_CORRUPT_SCHEMA = """
CREATE TABLE IF NOT EXISTS corrupt (
    run TEXT NOT NULL,
    tag TEXT NOT NULL,
    manifest TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (run, tag, manifest)
);
"""
"""Stored checkpoints found not to match their manifest, by tag and manifest identity:
restores and retention pass over them until the tag is committed again (a new manifest) or
``traind verify`` finds it whole."""


@dataclass(frozen=True)
class Entry:
    """One checkpoint as the journal knows it."""

    tag: str
    step: int
    source: Path
    state: State
    backend: str | None


@dataclass(frozen=True)
class StagedFile(LocalFile):
    """A file as its snapshot was taken: its mtime too, to notice a rewrite afterwards."""

    mtime_ns: int


@dataclass(frozen=True)
class StoredFile:
    """A staged file and, once stored, its sha256; ``mtime_ns`` is None in journals
    written before mtimes were kept."""

    path: str
    size: int
    sha256: str | None
    mtime_ns: int | None


@dataclass
class _Batch:
    """The statements of ``file_done`` calls to write in one transaction."""

    ops: list[tuple[str, Sequence[Any]]] = field(default_factory=list)
    written: bool = False


class Journal:
    """Thread-safe access to one run's records in the journal database; async methods run
    in a worker thread."""

    def __init__(
        self, path: Path, run: RunIdentity, retry_initial: float = 0.2, retry_max: float = 10.0,
        reserve: Reserve | None = None,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.run = run
        self._reserve = reserve
        """Space set aside for this journal's writes on a full disk (see ``reserve``)."""
        self._reserve_spent = False
        self._key = run.key
        self._path = path
        self._retry = Backoff(retry_initial, retry_max)
        with _sqlite(path):
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._done_batch: _Batch | None = None
        """File records waiting for the next ``file_done`` transaction."""
        self._done_lock = asyncio.Lock()
        try:
            with _sqlite(path):
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                if self._columns("checkpoints") and "run" not in self._columns("checkpoints"):
                    self._add_column("files", "mtime_ns INTEGER")
                    self._tx_fn(self._migrate)
                self._db.executescript(_SCHEMA)
                self._db.executescript(_CORRUPT_SCHEMA)
                self._tx_fn(self._claim_legacy, staging_dir(path.parent, run))
        except BaseException:  # e.g. no space for the WAL index: see space.open_journal
            self._db.close()
            raise
        if reserve is not None and not reserve.arm():
            self._reserve_spent = True  # made once the disk has room

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}

    def _add_column(self, table: str, column: str) -> None:
        """Add ``column`` to a ``table`` written by an older traind, which lacks it."""
        name = column.split()[0]
        if name in self._columns(table):
            return
        try:
            self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
        except sqlite3.OperationalError as exc:  # another process (traind push) added it
            if "duplicate column" not in str(exc):
                raise

    def _migrate(self) -> None:
        """Rebuild the tables of a journal written before runs were kept, keyed by run too;
        every row is kept, with the legacy run (another process may have done it first)."""
        if "run" in self._columns("checkpoints"):
            return
        log.info("journal_migrated", to="runs kept apart", path=str(self._path))
        for table in _TABLES:
            self._db.execute(f"ALTER TABLE {table} RENAME TO {table}_before_runs")
        for statement in _SCHEMA.split(";")[:-1]:
            self._db.execute(statement)
        for table in _TABLES:
            columns = ", ".join(sorted(self._columns(f"{table}_before_runs")))
            self._db.execute(
                f"INSERT INTO {table} (run, {columns}) "
                f"SELECT ?, {columns} FROM {table}_before_runs",
                (_LEGACY,),
            )
            self._db.execute(f"DROP TABLE {table}_before_runs")

    def _claim_legacy(self, staging: Path) -> None:
        """Make this run's the legacy rows that provably are: the checkpoint was in this
        run's output_dir, and was stored to this run's store or not stored yet. Their
        snapshots move from the old shared staging into this run's. Any other legacy row
        stays as it was, for the run it belongs to."""
        rows = self._db.execute(
            "SELECT tag, source, backend, state FROM checkpoints WHERE run = ?", (_LEGACY,)
        ).fetchall()
        mine = {tag for (tag,) in self._db.execute(
            "SELECT tag FROM checkpoints WHERE run = ?", (self._key,))}
        claimed, pending = 0, []
        for tag, source, backend, state in rows:
            if (
                tag in mine
                or os.path.realpath(source) != os.path.realpath(self.run.output_dir / tag)
                or backend not in (None, self.run.store)
            ):
                continue
            legacy = staging.parent / tag
            if legacy.is_dir() and not (staging / tag).exists():
                staging.mkdir(parents=True, exist_ok=True)
                legacy.rename(staging / tag)
            for table in _TABLES:
                self._db.execute(
                    f"UPDATE {table} SET run = ? WHERE run = ? AND tag = ?",
                    (self._key, _LEGACY, tag),
                )
            claimed += 1
            if state in ("staged", "ready"):
                pending.append(tag)
        if claimed:
            log.info("journal_records_claimed", run=self._key, checkpoints=claimed,
                     pending=pending,
                     reason="written before runs were kept; from this output_dir and store")

    @classmethod
    def in_state_dir(cls, state_dir: Path, run: RunIdentity) -> Journal:
        """Open ``run``'s records in the journal kept in ``state_dir``, with its reserve
        there (made now when the disk has room). Blocking."""
        return cls(state_dir / "journal.sqlite3", run, reserve=Reserve.in_state_dir(state_dir))

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run ``statements`` as one transaction; retried with backoff, never given up,
        while the disk is full (one error event when it starts, one line when it passes)."""
        failed_at: float | None = None
        retries = 0

        async def once() -> None:
            """One transaction; on a full disk, once more at once if the reserve gave room."""
            try:
                await self._run(self._tx, statements)
            except JournalError as exc:
                if not exc.full or not await self._spend_reserve():
                    raise
                await self._run(self._tx, statements)

        def waiting(exc: BaseException, n: int, _: float) -> None:
            nonlocal failed_at, retries
            retries = n
            if failed_at is None:
                failed_at = time.monotonic()
                log.error(
                    "journal_write_failed", journal=str(self._path), error=str(exc),
                    free_bytes=_free_bytes(self._path.parent),
                    hint="retrying until it succeeds; free space in state_dir",
                )

        await retrying(once, self._retry, None, _full, waiting)
        if failed_at is not None:
            log.info("journal_write_recovered", journal=str(self._path), attempts=retries,
                     seconds=round(time.monotonic() - failed_at, 3))
        if self._reserve_spent:
            await self._restore_reserve()

    async def _spend_reserve(self) -> bool:
        """Give the reserve's space to the journal (a write failed for lack of it); return
        whether there was any to give."""
        if self._reserve is None or not await self._run(self._reserve.release):
            return False
        self._reserve_spent = True
        log.warning("journal_reserve_released", journal=str(self._path),
                    bytes=self._reserve.size, free_bytes=_free_bytes(self._path.parent),
                    hint="the disk is full; made again once it has room")
        return True

    async def _restore_reserve(self) -> None:
        """Make the reserve again once the disk has room to spare."""
        assert self._reserve is not None
        if await self._run(self._reserve.arm):
            self._reserve_spent = False
            log.info("journal_reserve_restored", journal=str(self._path),
                     bytes=self._reserve.size)

    def _tx(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        def run() -> None:
            for sql, params in statements:
                self._db.execute(sql, params)

        self._tx_fn(run)

    def _tx_fn(self, fn: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
        """Call ``fn`` inside one write transaction: all of it happens, or none."""
        with self._lock, _sqlite(self._path):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                fn(*args, **kwargs)
                self._db.execute("COMMIT")  # a full disk may fail the commit itself
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, _sqlite(self._path):
            return self._db.execute(sql, params).fetchall()

    # -- checkpoints --------------------------------------------------------------------

    def get_sync(self, tag: str) -> Entry | None:
        """The journal entry for ``tag``, if any."""
        rows = self._query(
            "SELECT tag, step, source, state, backend FROM checkpoints WHERE run = ? AND tag = ?",
            (self._key, tag),
        )
        return _entry(rows[0]) if rows else None

    async def get(self, tag: str) -> Entry | None:
        """The journal entry for ``tag``, if any."""
        return await self._run(self.get_sync, tag)

    def entries_sync(self, *states: State) -> list[Entry]:
        """Entries in any of ``states`` (all when none given), by step."""
        sql = "SELECT tag, step, source, state, backend FROM checkpoints WHERE run = ?"
        if states:
            sql += f" AND state IN ({','.join('?' * len(states))})"
        return [_entry(r) for r in self._query(sql + " ORDER BY step", (self._key, *states))]

    async def entries(self, *states: State) -> list[Entry]:
        """Entries in any of ``states`` (all when none given), by step."""
        return await self._run(self.entries_sync, *states)

    async def staged(self, tag: str, step: int, source: Path, files: Sequence[LocalFile]) -> None:
        """Record a (re)taken snapshot and its file list; forget any earlier upload progress."""
        now = time.time()
        ops: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT INTO checkpoints (run, tag, step, source, state, backend, updated_at) "
                "VALUES (?, ?, ?, ?, 'staged', NULL, ?) ON CONFLICT (run, tag) DO UPDATE SET "
                "state = 'staged', source = excluded.source, backend = NULL, "
                "updated_at = excluded.updated_at",
                (self._key, tag, step, str(source), now),
            ),
            ("DELETE FROM files WHERE run = ? AND tag = ?", (self._key, tag)),
            ("DELETE FROM resume WHERE run = ? AND tag = ?", (self._key, tag)),
        ]
        ops += [
            (
                "INSERT INTO files (run, tag, path, size, mtime_ns) VALUES (?, ?, ?, ?, ?)",
                (self._key, tag, f.path, f.size,
                 f.mtime_ns if isinstance(f, StagedFile) else None),
            )
            for f in files
        ]
        await self._write(ops)

    async def set_state(self, tag: str, state: State) -> None:
        """Move ``tag`` to ``state``."""
        await self._write(
            [("UPDATE checkpoints SET state = ?, updated_at = ? WHERE run = ? AND tag = ?",
              (state, time.time(), self._key, tag))],
        )

    async def record_committed(self, tag: str, step: int, source: Path, backend: str) -> None:
        """Record a checkpoint restored to ``source`` from the store: committed, its files
        verified against the manifest (an earlier snapshot's files are forgotten)."""
        await self._write(
            [
                (
                    "INSERT INTO checkpoints (run, tag, step, source, state, backend, "
                    "updated_at) VALUES (?, ?, ?, ?, 'committed', ?, ?) ON CONFLICT (run, tag) "
                    "DO UPDATE SET state = 'committed', source = excluded.source, "
                    "backend = excluded.backend, updated_at = excluded.updated_at",
                    (self._key, tag, step, str(source), backend, time.time()),
                ),
                ("DELETE FROM files WHERE run = ? AND tag = ?", (self._key, tag)),
                ("DELETE FROM resume WHERE run = ? AND tag = ?", (self._key, tag)),
            ],
        )

    async def begin_upload(self, tag: str, backend: str, fresh: bool = False) -> None:
        """Mark the backend ``tag`` goes to; a different backend than before, or ``fresh``
        (the store holds nothing of it: its claim was taken over), starts over."""
        entry = await self.get(tag)
        ops: list[tuple[str, Sequence[Any]]] = [
            ("UPDATE checkpoints SET backend = ? WHERE run = ? AND tag = ?",
             (backend, self._key, tag))
        ]
        if fresh or (entry is not None and entry.backend not in (None, backend)):
            ops += [
                ("UPDATE files SET sha256 = NULL WHERE run = ? AND tag = ?", (self._key, tag)),
                ("DELETE FROM resume WHERE run = ? AND tag = ?", (self._key, tag)),
            ]
        await self._write(ops)

    # -- files --------------------------------------------------------------------------

    def files_sync(self, tag: str) -> list[StoredFile]:
        """The staged files of ``tag`` with their sha256 where stored."""
        rows = self._query(
            "SELECT path, size, sha256, mtime_ns FROM files WHERE run = ? AND tag = ? "
            "ORDER BY path",
            (self._key, tag),
        )
        return [StoredFile(*r) for r in rows]

    async def files(self, tag: str) -> list[StoredFile]:
        """The staged files of ``tag`` with their sha256 where stored."""
        return await self._run(self.files_sync, tag)

    async def file_done(self, tag: str, path: str, sha256: str) -> None:
        """Record that ``path`` of ``tag`` is durably stored with this sha256; return once
        the record is durable. Records of files finishing while another is written share
        the next transaction, so many small files cost one fsync, not one each."""
        batch = self._done_batch
        if batch is None:
            batch = self._done_batch = _Batch()
        batch.ops += [
            ("UPDATE files SET sha256 = ? WHERE run = ? AND tag = ? AND path = ?",
             (sha256, self._key, tag, path)),
            ("DELETE FROM resume WHERE run = ? AND tag = ? AND path = ?",
             (self._key, tag, path)),
        ]
        async with self._done_lock:
            # Written by an earlier holder: done. Not (its write failed or was cancelled):
            # written again here, which is harmless, as every statement is idempotent.
            if batch.written:
                return
            if self._done_batch is batch:
                self._done_batch = None  # later records go to the next transaction
            await self._write(batch.ops)
            batch.written = True

    async def files_lost(self, tag: str, paths: Sequence[str]) -> None:
        """Record that ``paths`` of ``tag``, reported stored, are not in the store after all
        (the commit's check found them missing): the next upload sends them again."""
        await self._write([
            ("UPDATE files SET sha256 = NULL WHERE run = ? AND tag = ? AND path = ?",
             (self._key, tag, path)) for path in paths])

    async def load_resume(self, tag: str, path: str) -> str | None:
        """Opaque resume state a backend saved for one file."""
        rows = await self._run(
            self._query,
            "SELECT state FROM resume WHERE run = ? AND tag = ? AND path = ?",
            (self._key, tag, path),
        )
        return str(rows[0][0]) if rows else None

    async def save_resume(self, tag: str, path: str, state: str) -> None:
        """Save opaque resume state for one file."""
        await self._write(
            [("INSERT OR REPLACE INTO resume (run, tag, path, state) VALUES (?, ?, ?, ?)",
              (self._key, tag, path, state))],
        )

    async def resume_states(self, tag: str | None = None) -> list[tuple[str, str, str]]:
        """This run's saved (tag, path, state) resume records, optionally for one tag."""
        sql = "SELECT tag, path, state FROM resume WHERE run = ?"
        params: tuple[str, ...] = (self._key,)
        if tag is not None:
            sql, params = sql + " AND tag = ?", (self._key, tag)
        rows = await self._run(self._query, sql, params)
        return [(str(a), str(b), str(c)) for a, b, c in rows]

    # -- corrupt checkpoints in the store --------------------------------------------------

    async def record_corrupt(self, tag: str, manifest: str, reason: str) -> None:
        """Record that the stored ``tag`` with manifest identity ``manifest`` failed
        verification, and why."""
        await self._write(
            [("INSERT OR REPLACE INTO corrupt (run, tag, manifest, reason, at) "
              "VALUES (?, ?, ?, ?, ?)", (self._key, tag, manifest, reason, time.time()))],
        )

    async def forget_corrupt(self, tag: str, manifest: str | None = None) -> None:
        """Forget that the stored ``tag`` (with this manifest identity; any, when None) was
        corrupt: it verifies now (repaired in the store), or was committed again."""
        sql, params = "DELETE FROM corrupt WHERE run = ? AND tag = ?", [self._key, tag]
        if manifest is not None:
            sql, params = sql + " AND manifest = ?", [*params, manifest]
        await self._write([(sql, params)])

    async def corrupt(self) -> dict[tuple[str, str], str]:
        """Every recorded corrupt checkpoint: (tag, manifest identity) → reason."""
        rows = await self._run(
            self._query, "SELECT tag, manifest, reason FROM corrupt WHERE run = ?", (self._key,)
        )
        return {(str(t), str(m)): str(r) for t, m, r in rows}


@contextlib.contextmanager
def _sqlite(path: Path) -> Iterator[None]:
    """SQLite's errors as JournalError: the one place they are translated."""
    try:
        yield
    except sqlite3.Error as exc:
        raise JournalError(str(exc), path, getattr(exc, "sqlite_errorname", "")) from exc


def _full(exc: BaseException) -> bool:
    """Whether ``exc`` is a journal write that failed for lack of space: retried until it
    succeeds."""
    return isinstance(exc, JournalError) and exc.full


def _free_bytes(directory: Path) -> int | None:
    """Bytes free to unprivileged writers on ``directory``'s filesystem (None if unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _entry(row: tuple[Any, ...]) -> Entry:
    tag, step, source, state, backend = row
    return Entry(tag, int(step), Path(source), state, backend)


class JournalSession:
    """The ``UploadSession`` a backend gets for one checkpoint: progress plus the journal.
    ``guard``, awaited after each file is journalled, may raise to stop the upload before
    the next file (the streamer's check that the tag's claim is still its own)."""

    def __init__(self, journal: Journal, tag: str, advance: Callable[[int], None],
                 guard: Callable[[], Awaitable[None]] | None = None) -> None:
        self._journal = journal
        self._tag = tag
        self.advance = advance
        self._guard = guard

    async def file_done(self, path: str, sha256: str) -> None:
        await self._journal.file_done(self._tag, path, sha256)
        if self._guard is not None:
            await self._guard()

    async def load_state(self, path: str) -> str | None:
        return await self._journal.load_resume(self._tag, path)

    async def save_state(self, path: str, state: str) -> None:
        await self._journal.save_resume(self._tag, path, state)

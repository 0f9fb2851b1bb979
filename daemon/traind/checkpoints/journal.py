"""The journal: SQLite in ``state_dir`` recording each checkpoint's progress.

States: ``staged`` (snapshot taken, may still change) → ``ready`` (complete, queued) →
``committed`` (manifest stored) → ``pruning`` (its manifest may be gone from the store, its
files not yet) → ``pruned`` (removed from the store by retention).
Per file it keeps its size and mtime when snapshot (a later rewrite by the trainer is told
apart), the sha256 once the file is durably stored, and opaque resume state for backends
that upload in parts. Every write is one transaction, fsynced, so a daemon killed
at any moment restarts from the last thing that really happened.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

from traind.storage.base import LocalFile

State = Literal["staged", "ready", "committed", "pruning", "pruned"]
P = ParamSpec("P")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    tag TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    source TEXT NOT NULL,
    state TEXT NOT NULL,
    backend TEXT,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS files (
    tag TEXT NOT NULL,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT,
    mtime_ns INTEGER,
    PRIMARY KEY (tag, path)
);
CREATE TABLE IF NOT EXISTS resume (
    tag TEXT NOT NULL,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (tag, path)
);
"""

_CORRUPT_SCHEMA = """
CREATE TABLE IF NOT EXISTS corrupt (
    tag TEXT NOT NULL,
    manifest TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (tag, manifest)
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


class Journal:
    """Thread-safe access to the journal database; async methods run in a worker thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._db.executescript(_CORRUPT_SCHEMA)
        self._add_column("files", "mtime_ns INTEGER")
        self._lock = threading.Lock()

    def _add_column(self, table: str, column: str) -> None:
        """Add ``column`` to a ``table`` written by an older traind, which lacks it."""
        name = column.split()[0]
        if name in {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}:
            return
        try:
            self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
        except sqlite3.OperationalError as exc:  # another process (traind push) added it
            if "duplicate column" not in str(exc):
                raise

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> Journal:
        """Open the journal kept in ``state_dir``."""
        return cls(state_dir / "journal.sqlite3")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def _tx(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- checkpoints --------------------------------------------------------------------

    def get_sync(self, tag: str) -> Entry | None:
        """The journal entry for ``tag``, if any."""
        rows = self._query(
            "SELECT tag, step, source, state, backend FROM checkpoints WHERE tag = ?", (tag,)
        )
        return _entry(rows[0]) if rows else None

    async def get(self, tag: str) -> Entry | None:
        """The journal entry for ``tag``, if any."""
        return await self._run(self.get_sync, tag)

    def entries_sync(self, *states: State) -> list[Entry]:
        """Entries in any of ``states`` (all when none given), by step."""
        sql = "SELECT tag, step, source, state, backend FROM checkpoints"
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
        return [_entry(r) for r in self._query(sql + " ORDER BY step", states)]

    async def entries(self, *states: State) -> list[Entry]:
        """Entries in any of ``states`` (all when none given), by step."""
        return await self._run(self.entries_sync, *states)

    async def staged(self, tag: str, step: int, source: Path, files: Sequence[LocalFile]) -> None:
        """Record a (re)taken snapshot and its file list; forget any earlier upload progress."""
        now = time.time()
        ops: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT INTO checkpoints (tag, step, source, state, backend, updated_at) "
                "VALUES (?, ?, ?, 'staged', NULL, ?) ON CONFLICT (tag) DO UPDATE SET "
                "state = 'staged', source = excluded.source, backend = NULL, "
                "updated_at = excluded.updated_at",
                (tag, step, str(source), now),
            ),
            ("DELETE FROM files WHERE tag = ?", (tag,)),
            ("DELETE FROM resume WHERE tag = ?", (tag,)),
        ]
        ops += [
            (
                "INSERT INTO files (tag, path, size, mtime_ns) VALUES (?, ?, ?, ?)",
                (tag, f.path, f.size, f.mtime_ns if isinstance(f, StagedFile) else None),
            )
            for f in files
        ]
        await self._run(self._tx, ops)

    async def set_state(self, tag: str, state: State) -> None:
        """Move ``tag`` to ``state``."""
        await self._run(
            self._tx,
            [("UPDATE checkpoints SET state = ?, updated_at = ? WHERE tag = ?",
              (state, time.time(), tag))],
        )

    async def record_committed(self, tag: str, step: int, source: Path, backend: str) -> None:
        """Record a checkpoint restored to ``source`` from the store: committed, its files
        verified against the manifest (an earlier snapshot's files are forgotten)."""
        await self._run(
            self._tx,
            [
                (
                    "INSERT INTO checkpoints (tag, step, source, state, backend, updated_at) "
                    "VALUES (?, ?, ?, 'committed', ?, ?) ON CONFLICT (tag) DO UPDATE SET "
                    "state = 'committed', source = excluded.source, "
                    "backend = excluded.backend, updated_at = excluded.updated_at",
                    (tag, step, str(source), backend, time.time()),
                ),
                ("DELETE FROM files WHERE tag = ?", (tag,)),
                ("DELETE FROM resume WHERE tag = ?", (tag,)),
            ],
        )

    async def begin_upload(self, tag: str, backend: str) -> None:
        """Mark the backend ``tag`` goes to; a different backend than before starts over."""
        entry = await self.get(tag)
        ops: list[tuple[str, Sequence[Any]]] = [
            ("UPDATE checkpoints SET backend = ? WHERE tag = ?", (backend, tag))
        ]
        if entry is not None and entry.backend not in (None, backend):
            ops += [
                ("UPDATE files SET sha256 = NULL WHERE tag = ?", (tag,)),
                ("DELETE FROM resume WHERE tag = ?", (tag,)),
            ]
        await self._run(self._tx, ops)

    # -- files --------------------------------------------------------------------------

    def files_sync(self, tag: str) -> list[StoredFile]:
        """The staged files of ``tag`` with their sha256 where stored."""
        rows = self._query(
            "SELECT path, size, sha256, mtime_ns FROM files WHERE tag = ? ORDER BY path", (tag,)
        )
        return [StoredFile(*r) for r in rows]

    async def files(self, tag: str) -> list[StoredFile]:
        """The staged files of ``tag`` with their sha256 where stored."""
        return await self._run(self.files_sync, tag)

    async def file_done(self, tag: str, path: str, sha256: str) -> None:
        """Record that ``path`` of ``tag`` is durably stored with this sha256."""
        await self._run(
            self._tx,
            [
                ("UPDATE files SET sha256 = ? WHERE tag = ? AND path = ?", (sha256, tag, path)),
                ("DELETE FROM resume WHERE tag = ? AND path = ?", (tag, path)),
            ],
        )

    async def load_resume(self, tag: str, path: str) -> str | None:
        """Opaque resume state a backend saved for one file."""
        rows = await self._run(
            self._query, "SELECT state FROM resume WHERE tag = ? AND path = ?", (tag, path)
        )
        return str(rows[0][0]) if rows else None

    async def save_resume(self, tag: str, path: str, state: str) -> None:
        """Save opaque resume state for one file."""
        await self._run(
            self._tx,
            [("INSERT OR REPLACE INTO resume (tag, path, state) VALUES (?, ?, ?)",
              (tag, path, state))],
        )

    async def resume_states(self, tag: str | None = None) -> list[tuple[str, str, str]]:
        """All saved (tag, path, state) resume records, optionally for one tag."""
        sql, params = "SELECT tag, path, state FROM resume", tuple[str, ...]()
        if tag is not None:
            sql, params = sql + " WHERE tag = ?", (tag,)
        rows = await self._run(self._query, sql, params)
        return [(str(a), str(b), str(c)) for a, b, c in rows]

    # -- corrupt checkpoints in the store --------------------------------------------------

    async def record_corrupt(self, tag: str, manifest: str, reason: str) -> None:
        """Record that the stored ``tag`` with manifest identity ``manifest`` failed
        verification, and why."""
        await self._run(
            self._tx,
            [("INSERT OR REPLACE INTO corrupt (tag, manifest, reason, at) VALUES (?, ?, ?, ?)",
              (tag, manifest, reason, time.time()))],
        )

    async def forget_corrupt(self, tag: str, manifest: str | None = None) -> None:
        """Forget that the stored ``tag`` (with this manifest identity; any, when None) was
        corrupt: it verifies now (repaired in the store), or was committed again."""
        sql, params = "DELETE FROM corrupt WHERE tag = ?", [tag]
        if manifest is not None:
            sql, params = sql + " AND manifest = ?", [tag, manifest]
        await self._run(self._tx, [(sql, params)])

    async def corrupt(self) -> dict[tuple[str, str], str]:
        """Every recorded corrupt checkpoint: (tag, manifest identity) → reason."""
        rows = await self._run(self._query, "SELECT tag, manifest, reason FROM corrupt")
        return {(str(t), str(m)): str(r) for t, m, r in rows}


def _entry(row: tuple[Any, ...]) -> Entry:
    tag, step, source, state, backend = row
    return Entry(tag, int(step), Path(source), state, backend)


class JournalSession:
    """The ``UploadSession`` a backend gets for one checkpoint: progress plus the journal."""

    def __init__(self, journal: Journal, tag: str, advance: Callable[[int], None]) -> None:
        self._journal = journal
        self._tag = tag
        self.advance = advance

    async def file_done(self, path: str, sha256: str) -> None:
        await self._journal.file_done(self._tag, path, sha256)

    async def load_state(self, path: str) -> str | None:
        return await self._journal.load_resume(self._tag, path)

    async def save_state(self, path: str, state: str) -> None:
        await self._journal.save_resume(self._tag, path, state)

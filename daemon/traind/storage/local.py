"""The local store: a directory on local disk or an NFS mount (the default; needs nothing).

Each file is written as ``<name>.traind-part``, fsynced and renamed, so a file with its
final name is always whole. A create-only put is a hard link, which fails atomically when
the name exists (on NFS too); a replace-if-version put reads, compares and renames, so two
writers replacing one object at the same instant can both succeed (``update`` is False).
What the store holds is input: nothing is written or read through a symbolic link at or
below the run's directory (``_checked``), and a stored file is opened without blocking or
following a link, and read no further than its manifest's size (``open_regular``).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import secrets
import stat
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from traind.config import LocalStorage
from traind.errors import IntegrityError, StorageError
from traind.layout.keys import check_key, check_relpath
from traind.storage.base import (
    OVERWRITE,
    Advance,
    Blob,
    Capabilities,
    LocalFile,
    ObjectMeta,
    PutMode,
    UploadSession,
)
from traind.storage.memory import version_of
from traind.util.fileio import (
    abandonable,
    copy_hashed,
    create_exclusive,
    in_thread,
    not_a_directory,
    open_regular,
    unique_temporary_name,
    write_atomic,
)
from traind.util.tasks import fan_out

CAPABILITIES = Capabilities(create=True, update=False,
                            claim="exclusive create (hard link): a tag is one writer's")
P = ParamSpec("P")
T = TypeVar("T")
USING = "use the local store at"
"""What failing local file work was doing, in its StorageError."""


class LocalStore:
    """Objects as files under ``<path>/<run>/``."""

    def __init__(self, config: LocalStorage, run: str) -> None:
        self._root = config.path / run
        self._concurrency = config.concurrency

    @property
    def describe(self) -> str:
        return f"local:{self._root}"

    def where(self, key: str) -> str:
        return str(self._root / key)

    def _path(self, key: str) -> Path:
        return self._root / check_key(key)

    def _checked(self, key: str, *, write: bool) -> Path:
        """The path of ``key`` once the run's directory and each directory between it and
        ``key`` are found to be directories or missing (to be made): else LinkedPathError,
        for a write or at the run's own directory, or, for a read, IntegrityError (the
        checkpoint's corruption)."""
        path = self._path(key)
        self._check_dir(path.parent, write=write)
        return path

    def _check_dir(self, directory: Path, *, write: bool) -> None:
        """Raise as ``_checked`` unless ``directory`` and those above it up to the run's
        directory are directories or missing."""
        here = self._root
        for part in ("", *directory.relative_to(self._root).parts):
            here = here / part if part else here
            try:
                mode = os.lstat(here).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return
            if not stat.S_ISDIR(mode):
                raise not_a_directory(here, mode, write=write or here == self._root)

    async def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        return await _io(self._put, key, data, mode)

    def _put(self, key: str, data: bytes, mode: PutMode) -> bool:
        path = self._checked(key, write=True)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if stat.S_ISLNK(found := os.lstat(path).st_mode):
                raise not_a_directory(path, found, write=True, belongs="a regular file")
        if mode.kind == "create":
            return create_exclusive(path, data)
        if mode.kind == "update" and (
                (blob := _read(path)) is None or version_of(blob) != mode.version):
            return False
        write_atomic(path, data)
        return True

    async def get(self, key: str) -> Blob | None:
        return await _io(self._get, key)

    def _get(self, key: str) -> Blob | None:
        data = _read(self._checked(key, write=False))
        return None if data is None else Blob(data, version_of(data))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await _io(self._get_range, key, start, end)

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._checked(key, write=False)
        try:
            fd = open_regular(path)
        except FileNotFoundError as exc:
            raise StorageError(f"{path}: no such file", code="ENOENT", key=str(path)) from exc
        with open(fd, "rb", buffering=0) as f:
            f.seek(start)
            return f.read(max(0, end - start))

    async def head(self, key: str) -> ObjectMeta | None:
        return await _io(self._head, key)

    def _head(self, key: str) -> ObjectMeta | None:
        """The regular file at ``key``; None for anything else, and through a link."""
        try:
            st = self._checked(key, write=False).lstat()
        except (FileNotFoundError, NotADirectoryError, IntegrityError):
            return None
        return ObjectMeta(key, st.st_size, st.st_mtime) if stat.S_ISREG(st.st_mode) else None

    async def list(self, prefix: str) -> list[ObjectMeta]:
        return await _io(lambda: list(self._walk(prefix)))

    def _walk(self, prefix: str) -> Iterator[ObjectMeta]:
        """The regular files under ``prefix``; none through a link."""
        top, _, _ = prefix.rpartition("/")
        base = self._root / check_key(top) if top else self._root
        try:
            self._check_dir(base, write=False)
        except IntegrityError:
            return
        for dirpath, _dirs, names in os.walk(base):
            rel = os.path.relpath(dirpath, self._root)
            for name in names:
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                        st = os.lstat(os.path.join(dirpath, name))
                        if stat.S_ISREG(st.st_mode):
                            yield ObjectMeta(key, st.st_size, st.st_mtime)

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return await _io(self._list_dirs, prefix)

    def _list_dirs(self, prefix: str) -> builtins.list[str]:
        base = self._root / check_key(prefix.rstrip("/")) if prefix else self._root
        try:
            self._check_dir(base, write=False)
            return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError, IntegrityError):
            return []

    async def delete(self, keys: Sequence[str]) -> None:
        await _io(lambda: self._delete([self._checked(k, write=True) for k in keys]))

    def _delete(self, paths: builtins.list[Path]) -> None:
        dirs = set()
        for path in paths:
            path.unlink(missing_ok=True)
            dirs.add(path.parent)
        for parent in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            while parent != self._root and parent.is_relative_to(self._root):
                try:
                    parent.rmdir()  # the tag's directory goes with its last object
                except OSError:
                    break
                parent = parent.parent

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        async def one(f: LocalFile) -> None:
            key = prefix + check_relpath(f.path)
            sha = await abandonable(USING, None, lambda abandoned: _store_file(
                root / f.path, self._checked(key, write=True), session.advance, abandoned))
            await session.file_done(f.path, sha)

        await fan_out(files, self._concurrency, one)

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        async def one(f: LocalFile) -> tuple[str, str]:
            target = dest / check_relpath(f.path)
            _, sha = await abandonable(USING, None, lambda abandoned: (
                _fetch_file(self._checked(prefix + f.path, write=False), target, f.size,
                            advance, abandoned)))
            return f.path, sha

        return dict(await fan_out(files, self._concurrency, one))

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        return 0  # a partial file is written again by the next send of its checkpoint

    async def probe(self) -> None:
        await _io(self._probe)

    def _probe(self) -> None:
        probe = self._checked(f".traind-probe-{secrets.token_hex(6)}", write=True)
        probe.parent.mkdir(parents=True, exist_ok=True)  # hosts probe at once: unique names
        probe.write_bytes(b"ok")
        probe.unlink()

    async def aclose(self) -> None:
        return None


async def _io(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking work on the store in a thread (``fileio.in_thread``)."""
    return await in_thread(USING, None, fn, *args, **kwargs)


def _store_file(src: Path, target: Path, advance: Advance, abandoned: threading.Event) -> str:
    """Copy ``src`` to ``target`` under a temporary name of its own (two hosts may send one
    path of a multi-node checkpoint at once), then rename; return its sha256."""
    part = target.with_name(unique_temporary_name(target.name))
    try:
        _, sha = copy_hashed(src, part, advance, abandoned=abandoned)
        os.replace(part, target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return sha


def _fetch_file(src: Path, target: Path, size: int, advance: Advance,
                abandoned: threading.Event) -> tuple[int, str]:
    """Copy a stored file of ``size`` bytes out for a restore; one that is not in the store
    fails it as not matching the manifest (IntegrityError), unlike a store that cannot be
    read, as does one that is not a regular file of that size (``open_regular``)."""
    try:
        return copy_hashed(src, target, advance, durable=False, size=size, abandoned=abandoned)
    except FileNotFoundError as exc:
        if os.path.lexists(src):
            raise
        raise IntegrityError(f"{src}: missing from the store") from exc


def _read(path: Path) -> bytes | None:
    """A small stored object's bytes, None when there is none; one that is not a regular
    file raises IntegrityError naming it (``open_regular``)."""
    try:
        fd = open_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with open(fd, "rb", buffering=0) as f:
        return f.read()


"""The local store: a directory on local disk or an NFS mount (the default; needs nothing).

Each file is written as ``<name>.traind-part``, fsynced and renamed, so a file with its
final name is always whole. A create-only put is a hard link, which fails atomically when
the name exists (on NFS too); a replace-if-version put reads, compares and renames, so two
writers replacing one object at the same instant can both succeed (``update`` is False).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import secrets
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
    copy_hashed,
    create_exclusive,
    in_thread,
    unique_temporary_name,
    write_atomic,
)
from traind.util.tasks import fan_out

CAPABILITIES = Capabilities(create=True, update=False,
                            claim="exclusive create (hard link): a tag is one writer's")
P = ParamSpec("P")
T = TypeVar("T")


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

    async def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        return await _io(self._put, self._path(key), data, mode)

    @staticmethod
    def _put(path: Path, data: bytes, mode: PutMode) -> bool:
        if mode.kind == "create":
            return create_exclusive(path, data)
        if mode.kind == "update":
            try:
                if version_of(path.read_bytes()) != mode.version:
                    return False
            except FileNotFoundError:
                return False
        write_atomic(path, data)
        return True

    async def get(self, key: str) -> Blob | None:
        return await _io(self._get, self._path(key))

    @staticmethod
    def _get(path: Path) -> Blob | None:
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Blob(data, version_of(data))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await _io(self._get_range, self._path(key), start, end)

    @staticmethod
    def _get_range(path: Path, start: int, end: int) -> bytes:
        try:
            with open(path, "rb", buffering=0) as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except FileNotFoundError as exc:
            raise StorageError(f"{path}: no such file", code="ENOENT", key=str(path)) from exc

    async def head(self, key: str) -> ObjectMeta | None:
        return await _io(self._head, key)

    def _head(self, key: str) -> ObjectMeta | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectMeta(key, st.st_size, st.st_mtime)

    async def list(self, prefix: str) -> list[ObjectMeta]:
        return await _io(lambda: list(self._walk(prefix)))

    def _walk(self, prefix: str) -> Iterator[ObjectMeta]:
        top, _, _ = prefix.rpartition("/")
        base = self._root / check_key(top) if top else self._root
        for dirpath, _dirs, names in os.walk(base):
            rel = os.path.relpath(dirpath, self._root)
            for name in names:
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                        st = os.stat(os.path.join(dirpath, name))
                        yield ObjectMeta(key, st.st_size, st.st_mtime)

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return await _io(self._list_dirs, self._root / prefix if prefix else self._root)

    @staticmethod
    def _list_dirs(base: Path) -> builtins.list[str]:
        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    async def delete(self, keys: Sequence[str]) -> None:
        paths = [self._path(k) for k in keys]
        await _io(self._delete, paths)

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
            target = self._path(prefix + check_relpath(f.path))
            sha = await _io(_store_file, root / f.path, target, session.advance)
            await session.file_done(f.path, sha)

        await fan_out(files, self._concurrency, one)

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        async def one(f: LocalFile) -> tuple[str, str]:
            src = self._path(prefix + f.path)
            _, sha = await _io(_fetch_file, src, dest / check_relpath(f.path), advance)
            return f.path, sha

        return dict(await fan_out(files, self._concurrency, one))

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        return 0  # a partial file is written again by the next send of its checkpoint

    async def probe(self) -> None:
        await _io(self._probe)

    def _probe(self) -> None:
        probe = self._root / f".traind-probe-{secrets.token_hex(6)}"  # hosts probe at once
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()

    async def aclose(self) -> None:
        return None


async def _io(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking work on the store in a thread (``fileio.in_thread``)."""
    return await in_thread("use the local store at", None, fn, *args, **kwargs)


def _store_file(src: Path, target: Path, advance: Advance) -> str:
    """Copy ``src`` to ``target`` under a temporary name of its own (two hosts may send one
    path of a multi-node checkpoint at once), then rename; return its sha256."""
    part = target.with_name(unique_temporary_name(target.name))
    try:
        _, sha = copy_hashed(src, part, advance)
        os.replace(part, target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return sha


def _fetch_file(src: Path, target: Path, advance: Advance) -> tuple[int, str]:
    """Copy a stored file out for a restore; one that is not in the store fails it as
    not matching the manifest (IntegrityError), unlike a store that cannot be read."""
    try:
        return copy_hashed(src, target, advance, durable=False)
    except FileNotFoundError as exc:
        if os.path.lexists(src):
            raise
        raise IntegrityError(f"{src}: missing from the store") from exc

"""The local backend: a directory on local disk or an NFS mount (the default; needs nothing).

Each file is written as ``<name>.traind-part``, fsynced and renamed, so a file with its
final name is always whole; the manifest goes the same way, last. The claim and the
manifest are created exclusively (a hard link, which fails when the name exists).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from traind.checkpoints.manifest import Manifest, Writer, listed
from traind.config import LocalStorage
from traind.errors import IntegrityError, StorageError, TransientStorageError
from traind.storage.base import Advance, LocalFile, UploadSession
from traind.storage.claim import Lease, check_committed, check_held, check_lease, is_claim_file
from traind.storage.fileio import copy_hashed, create_exclusive, fsync_dir
from traind.storage.keys import CLAIM_NAME, MANIFEST_NAME, check_relpath, check_tag
from traind.storage.tasks import Slots, task_group

PART_SUFFIX = ".traind-part"
P = ParamSpec("P")
T = TypeVar("T")


class LocalBackend:
    """Checkpoints under ``<path>/<run>/<tag>/``."""

    def __init__(self, config: LocalStorage, run: str) -> None:
        self._root = config.path / run
        self._concurrency = config.concurrency

    @property
    def describe(self) -> str:
        return f"local:{self._root}"

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        dest = self._root / check_tag(tag)
        slots = Slots(self._concurrency)

        async def one(f: LocalFile) -> None:
            target = dest / check_relpath(f.path)
            _, sha = await _io(_store_file, root / f.path, target, session.advance)
            await session.file_done(f.path, sha)

        async with task_group() as tg:
            for f in files:
                tg.create_task(slots.run(functools.partial(one, f)))

    async def claim(self, tag: str, writer: Writer) -> None:
        await _io(self._claim, tag, writer)

    def _claim(self, tag: str, writer: Writer) -> None:
        path = self._root / check_tag(tag) / CLAIM_NAME
        if not create_exclusive(path, Lease.new(writer).to_json()):
            if (found := self._lease(tag)) is None:  # taken over or pruned meanwhile
                raise TransientStorageError(f"{tag}: the claim {path} vanished; retrying")
            check_lease(tag, writer, found, self._manifest(tag), str(path))
            return
        try:  # committed by a traind from before claims: a manifest without a claim
            check_committed(tag, writer, self._manifest(tag), self.describe)
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    def _lease(self, tag: str) -> Lease | None:
        path = self._root / tag / CLAIM_NAME
        try:
            return Lease.from_json(path.read_bytes())
        except FileNotFoundError:
            return None

    async def renew(self, tag: str, writer: Writer) -> None:
        await _io(self._renew, tag, writer, None)

    async def release(self, tag: str, writer: Writer) -> None:
        found = await _io(self._lease, check_tag(tag))
        if found is not None and found.writer.id == writer.id:
            await _io(self._renew, tag, writer, 0.0)

    def _renew(self, tag: str, writer: Writer, at: float | None) -> None:
        path = self._root / check_tag(tag) / CLAIM_NAME
        found = check_held(tag, writer, self._lease(tag), str(path))
        _write_atomic(path, found.renewed(at).to_json())

    async def take_over(self, tag: str, stale: Lease, writer: Writer) -> bool:
        return await _io(self._take_over, self._root / check_tag(tag), stale, writer)

    def _take_over(self, base: Path, stale: Lease, writer: Writer) -> bool:
        if not create_exclusive(base / stale.marker, writer.to_json()):
            return False  # another writer is taking it over
        if self._lease(base.name) != stale:  # renewed meanwhile: its writer lives
            (base / stale.marker).unlink(missing_ok=True)
            return False
        for entry in base.iterdir():
            if not is_claim_file(entry.name):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        (base / CLAIM_NAME).unlink(missing_ok=True)
        fsync_dir(base)
        return True

    def _manifest(self, tag: str) -> Manifest | None:
        path = self._root / tag / MANIFEST_NAME
        return Manifest.from_json(path.read_bytes()) if path.is_file() else None

    async def commit(self, manifest: Manifest) -> None:
        await _io(self._commit, manifest)

    def _commit(self, manifest: Manifest) -> None:
        target = self._root / check_tag(manifest.tag) / MANIFEST_NAME
        data = manifest.to_json()
        if not create_exclusive(target, data):
            check_committed(manifest.tag, manifest.writer, self._manifest(manifest.tag),
                            self.describe)
            _write_atomic(target, data)  # our own, retried: the objects are these

    async def manifests(self) -> list[Manifest]:
        return await _io(self._read_manifests)

    def _read_manifests(self) -> list[Manifest]:
        if not self._root.is_dir():
            return []
        found = []
        for entry in sorted(self._root.iterdir()):
            path = entry / MANIFEST_NAME
            if path.is_file() and (manifest := listed(path.read_bytes(), str(path))):
                found.append(manifest)
        return found

    async def download(self, manifest: Manifest, dest: Path, advance: Advance) -> dict[str, str]:
        src = self._root / check_tag(manifest.tag)
        slots = Slots(self._concurrency)
        hashes: dict[str, str] = {}

        async def one(path: str) -> None:
            _, hashes[path] = await _io(_fetch_file, src / path, dest / check_relpath(path),
                                        advance)

        async with task_group() as tg:
            for entry in manifest.files:
                tg.create_task(slots.run(functools.partial(one, entry.path)))
        return hashes

    async def delete(self, tag: str) -> None:
        await _io(self._delete, self._root / check_tag(tag))

    @staticmethod
    def _delete(path: Path) -> None:
        (path / MANIFEST_NAME).unlink(missing_ok=True)
        if not path.exists():
            return
        fsync_dir(path)
        for entry in path.iterdir():  # the claim goes last: nobody writes here meanwhile
            if entry.name != CLAIM_NAME:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)

    async def probe(self) -> str:
        return await _io(self._probe)

    def _probe(self) -> str:
        probe = self._root / ".traind-probe"
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
        return "exclusive create (hard link): a tag is one writer's"

    async def cleanup(self, resume_states: Collection[str]) -> int:
        # Partial files are rewritten by the next upload of their checkpoint.
        return 0

    async def aclose(self) -> None:
        return None


async def _io(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking file work in a thread, translating OSError into StorageError."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except IntegrityError:
        raise
    except OSError as exc:
        raise StorageError(f"local store: {exc.strerror or exc}: {exc.filename or ''}") from exc


def _store_file(src: Path, target: Path, advance: Advance) -> tuple[int, str]:
    part = target.with_name(target.name + PART_SUFFIX)
    result = copy_hashed(src, part, advance)
    os.replace(part, target)
    return result


def _fetch_file(src: Path, target: Path, advance: Advance) -> tuple[int, str]:
    """Copy a stored file out for a restore; one that is not in the store fails it as
    not matching the manifest (IntegrityError), unlike a store that cannot be read."""
    try:
        return copy_hashed(src, target, advance, durable=False)
    except FileNotFoundError as exc:
        if os.path.lexists(src):
            raise
        raise IntegrityError(f"{src}: missing from the store") from exc


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + PART_SUFFIX)
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, target)
    fsync_dir(target.parent)

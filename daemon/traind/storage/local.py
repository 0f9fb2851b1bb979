"""The local backend: a directory on local disk or an NFS mount (the default; needs nothing).

Each file is written as ``<name>.traind-part``, fsynced and renamed, so a file with its
final name is always whole; the manifest goes the same way, last. The claim and the
manifest are created exclusively (a hard link, which fails when the name exists).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from traind.config import LocalStorage
from traind.errors import ConflictError, IntegrityError, TransientStorageError
from traind.layout.keys import (
    AGREEMENT_DIR,
    CLAIM_NAME,
    MANIFEST_NAME,
    PART_CLAIM_PREFIX,
    PART_PREFIX,
    check_relpath,
    check_tag,
)
from traind.layout.manifest import Manifest, Writer, listed
from traind.layout.parts import Part, PartsDisagreeError, part_claim_name, part_name, part_rank
from traind.storage.base import Advance, LocalFile, UploadSession
from traind.storage.claim import (
    Lease,
    check_claim,
    check_committed,
    check_held,
    check_lease,
    is_claim_file,
)
from traind.storage.fileio import (
    copy_hashed,
    create_exclusive,
    fsync_dir,
    hash_file,
    in_thread,
    temporary_name,
    unique_temporary_name,
    write_atomic,
)
from traind.storage.tasks import fan_out

_REQUEST = "start-"
"""Node R's start request: ``.traind-resume/start-<R>.json``, its nonce."""
_BOARD = "board.json"
P = ParamSpec("P")
T = TypeVar("T")


class LocalBackend:
    """Checkpoints under ``<path>/<run>/<tag>/``."""

    def __init__(self, config: LocalStorage, run: str) -> None:
        self._root = config.path / run
        self._concurrency = config.concurrency
        self._agreement = self._root / AGREEMENT_DIR

    @property
    def describe(self) -> str:
        return f"local:{self._root}"

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        await self._send(tag, root, files, session, _store_file)

    async def _send(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession,
        store: Callable[[Path, Path, Advance], str],
    ) -> None:
        """Copy ``files`` under ``tag`` with ``store`` (in a thread, ``concurrency`` at once),
        each journalled through ``session`` as soon as it is in place."""
        dest = self._root / check_tag(tag)

        async def one(f: LocalFile) -> None:
            sha = await _io(store, root / f.path, dest / check_relpath(f.path), session.advance)
            await session.file_done(f.path, sha)

        await fan_out(files, self._concurrency, one)

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
            if (holder := _part_holder(path.parent)) is not None:  # a multi-node job's tag
                raise ConflictError(tag, str(writer), str(holder), str(path.parent))
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
        write_atomic(path, found.renewed(at).to_json())

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
    async def claim_part(self, tag: str, rank: int, writer: Writer) -> None:
        await _io(self._claim_part, tag, rank, writer)

    def _claim_part(self, tag: str, rank: int, writer: Writer) -> None:
        path = self._root / check_tag(tag) / part_claim_name(rank)
        made = create_exclusive(path, writer.to_json())
        if not made:
            check_claim(tag, writer, Writer.from_json(path.read_bytes()), str(path))
        whole = path.with_name(CLAIM_NAME)  # checked after ours exists: a racing single
        if whole.is_file():  # writer checks for parts after its claim exists, so one sees
            if made:  # the other
                path.unlink(missing_ok=True)
            raise ConflictError(tag, str(writer), str(Writer.from_json(whole.read_bytes())),
                                str(whole))

    async def part_claim(self, tag: str, rank: int) -> Writer | None:
        return await _io(self._part_claim, self._root / check_tag(tag) / part_claim_name(rank))

    @staticmethod
    def _part_claim(path: Path) -> Writer | None:
        return Writer.from_json(path.read_bytes()) if path.is_file() else None

    async def upload_part(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        await self._send(tag, root, files, session, functools.partial(_store_file_once, tag))

    async def commit_part(self, part: Part) -> None:
        target = self._root / check_tag(part.tag) / part_name(part.node_rank)
        await _io(write_atomic, target, part.to_json())

    async def part_ranks(self, tag: str) -> set[int]:
        return await _io(self._part_ranks, self._root / check_tag(tag))

    @staticmethod
    def _part_ranks(tag_dir: Path) -> set[int]:
        if not tag_dir.is_dir():
            return set()
        return {rank for p in tag_dir.glob(f"{PART_PREFIX}*.json")
                if (rank := part_rank(p.name)) is not None}

    async def committed(self, tag: str) -> Manifest | None:
        return await _io(self._manifest, check_tag(tag))

    async def request_start(self, rank: int, nonce: str) -> None:
        await _io(write_atomic, self._agreement / f"{_REQUEST}{rank}.json", nonce.encode())

    async def withdraw_start(self, rank: int, nonce: str) -> None:
        await _io(self._withdraw, self._agreement / f"{_REQUEST}{rank}.json", nonce)

    @staticmethod
    def _withdraw(path: Path, nonce: str) -> None:
        if path.is_file() and path.read_bytes().decode(errors="replace") == nonce:
            path.unlink(missing_ok=True)

    async def start_requests(self) -> dict[int, str]:
        return await _io(self._start_requests)

    def _start_requests(self) -> dict[int, str]:
        if not self._agreement.is_dir():
            return {}
        found = {}
        for path in self._agreement.glob(f"{_REQUEST}*.json"):
            rank = path.name.removeprefix(_REQUEST).removesuffix(".json")
            if rank.isdigit():
                with contextlib.suppress(FileNotFoundError):  # withdrawn meanwhile
                    found[int(rank)] = path.read_bytes().decode(errors="replace")
        return found

    async def write_board(self, data: bytes) -> None:
        await _io(write_atomic, self._agreement / _BOARD, data)

    async def read_board(self) -> bytes | None:
        return await _io(self._read_board)

    def _read_board(self) -> bytes | None:
        try:
            return (self._agreement / _BOARD).read_bytes()
        except FileNotFoundError:
            return None

    async def uncommitted(self) -> dict[str, list[Part]]:
        return await _io(self._uncommitted)

    def _uncommitted(self) -> dict[str, list[Part]]:
        if not self._root.is_dir():
            return {}
        return {entry.name: parts for entry in sorted(self._root.iterdir())
                if not (entry / MANIFEST_NAME).exists() and (parts := self._read_parts(entry))}

    async def parts(self, tag: str) -> list[Part]:
        return await _io(self._read_parts, self._root / check_tag(tag))

    @staticmethod
    def _read_parts(tag_dir: Path) -> list[Part]:
        if not tag_dir.is_dir():
            return []
        return [Part.from_json(p.read_bytes()) for p in sorted(tag_dir.glob(f"{PART_PREFIX}*"))
                if p.name.endswith(".json")]

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
            write_atomic(target, data)  # our own, retried: the objects are these

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

        async def one(path: str) -> tuple[str, str]:
            _, sha = await _io(_fetch_file, src / path, dest / check_relpath(path), advance)
            return path, sha

        return dict(await fan_out((e.path for e in manifest.files), self._concurrency, one))

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
    """Run blocking work on the store in a thread (``fileio.in_thread``)."""
    return await in_thread("use the local store at", None, fn, *args, **kwargs)


def _store_file(src: Path, target: Path, advance: Advance) -> str:
    """Copy ``src`` to ``target`` under a temporary name, then rename; return its sha256."""
    part = target.with_name(temporary_name(target.name))
    _, sha = copy_hashed(src, part, advance)
    os.replace(part, target)
    return sha


def _part_holder(tag_dir: Path) -> Writer | None:
    """A writer holding some node's part of the tag in ``tag_dir``, if any."""
    for claim in tag_dir.glob(f"{PART_CLAIM_PREFIX}*.json"):
        return Writer.from_json(claim.read_bytes())
    return None


def _store_file_once(tag: str, src: Path, target: Path, advance: Advance) -> str:
    """Store a part's file under a name of its own, then link it into place unless another
    host stored that path already: kept when the bytes agree, PartsDisagreeError if not."""
    part = target.with_name(unique_temporary_name(target.name))
    try:
        _, sha = copy_hashed(src, part, advance)
        try:
            os.link(part, target)
        except FileExistsError:
            _, there = hash_file(target)
            if there != sha:
                raise PartsDisagreeError(
                    f"{tag}: {target.name} in the store ({target}) differs from this host's "
                    f"(sha256 {there[:12]}… != {sha[:12]}…); another node saved other bytes "
                    "under the same path") from None
    finally:
        part.unlink(missing_ok=True)
    fsync_dir(target.parent)
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


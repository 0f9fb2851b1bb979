"""Restore: download into a temporary directory beside the destination, verify, rename.

A checkpoint that fails verification is an error and is never renamed into place. The
temporary directory holds a lock (``flock`` on the directory) while its restore runs, so
one left behind by a restore that was killed (its files are preallocated to full size) is
told apart from one in progress, and removed by the next restore into the same directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import structlog

from traind.checkpoints.state.journal import Journal
from traind.errors import IntegrityError, NotFoundError, StorageError
from traind.layout.manifest import Manifest, verify
from traind.protocol import CheckpointStore
from traind.util.fileio import fsync_dir
from traind.util.progress import Progress

log = structlog.get_logger("traind.restore")


def newest(manifests: list[Manifest]) -> Manifest | None:
    """The committed checkpoint with the highest step (ties: the latest created)."""
    return max(manifests, key=lambda m: (m.step, m.created_at), default=None)


async def find(storage: CheckpointStore, tag: str,
               manifests: list[Manifest] | None = None) -> Manifest:
    """The manifest for ``tag``, or for the newest checkpoint when ``tag`` is ``latest``,
    among ``manifests`` (default: the committed ones)."""
    if manifests is None:
        manifests = await storage.manifests()
    if tag == "latest":
        found = newest(manifests)
    else:
        found = next((m for m in manifests if m.tag == tag), None)
    if found is None:
        have = ", ".join(sorted(m.tag for m in manifests)) or "none"
        raise NotFoundError(f"no committed checkpoint {tag!r} in {storage.describe} (have: {have})")
    return found


def identity(manifest: Manifest) -> str:
    """Tells one stored manifest of a tag from another (the tag committed again): a
    checkpoint recorded as corrupt is tried again once its manifest changes."""
    return hashlib.sha256(manifest.to_json()).hexdigest()


async def restore_verified(
    storage: CheckpointStore,
    manifest: Manifest,
    parent: Path,
    journal: Journal | None,
    attempt: Callable[[Manifest], Awaitable[Path]] | None = None,
) -> Path | None:
    """Restore ``manifest`` as ``parent/<tag>`` (by ``attempt``, default ``restore``); None
    when it is corrupt: recorded so in ``journal`` before (not downloaded again), or found so
    now (logged as an error and recorded). Any other failure is raised: a store that is down
    says nothing about the checkpoint."""
    key = (manifest.tag, identity(manifest))
    known = await journal.corrupt() if journal is not None else {}
    if key in known:
        log.warning("restore_skipped_corrupt", tag=manifest.tag, step=manifest.step,
                    error=known[key], backend=storage.describe)
        return None
    try:
        return await (attempt or (lambda m: restore(storage, m, parent)))(manifest)
    except IntegrityError as exc:
        log.error("checkpoint_corrupt", tag=manifest.tag, step=manifest.step,
                  backend=storage.describe, error=str(exc),
                  hint="not used; an older checkpoint is tried (traind verify --all checks "
                       "the whole store)")
        if journal is not None:
            await journal.record_corrupt(*key, str(exc))
        return None


async def restore_newest(
    storage: CheckpointStore,
    manifests: list[Manifest],
    parent: Path,
    journal: Journal | None,
    attempt: Callable[[Manifest], Awaitable[Path]] | None = None,
) -> Manifest | None:
    """Restore the newest of ``manifests`` that verifies (``restore_verified``), falling
    back past corrupt ones; the one restored, or None when none verifies."""
    for manifest in sorted(manifests, key=lambda m: (m.step, m.created_at), reverse=True):
        if await restore_verified(storage, manifest, parent, journal, attempt) is not None:
            return manifest
    return None


async def restore(
    storage: CheckpointStore, manifest: Manifest, parent: Path, progress: Progress | None = None
) -> Path:
    """Restore ``manifest`` as ``parent/<tag>`` and return that path."""
    dest = parent / manifest.tag
    if os.path.lexists(dest):  # a link too, dangling or not: never restored through
        raise StorageError(f"{dest} already exists; refusing to overwrite it")
    progress = progress or Progress(manifest.total_bytes)
    started = time.monotonic()
    async with fetched(storage, manifest, parent, progress) as tmp:
        await asyncio.to_thread(os.rename, tmp, dest)
        await asyncio.to_thread(fsync_dir, parent)
    seconds = time.monotonic() - started
    log.info(
        "checkpoint_restored", tag=manifest.tag, step=manifest.step, files=len(manifest.files),
        bytes=manifest.total_bytes, seconds=round(seconds, 3),
        mb_per_s=round(manifest.total_bytes / 1e6 / max(seconds, 1e-9), 1),
        backend=storage.describe, dest=str(dest),
    )
    return dest


@contextlib.asynccontextmanager
async def fetched(
    storage: CheckpointStore, manifest: Manifest, parent: Path, progress: Progress
) -> AsyncIterator[Path]:
    """Download ``manifest``'s files into a locked temporary directory in ``parent`` and
    yield it, every file verified and durable; whatever is left in it is removed after."""
    parent.mkdir(parents=True, exist_ok=True)
    for path in await asyncio.to_thread(_remove_abandoned, parent):
        log.info("restore_leftover_removed", path=str(path))
    tmp = parent / f".{manifest.tag}{_TMP}{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    lock = await asyncio.to_thread(_lock, tmp)
    try:
        hashes = await storage.download(manifest, tmp, progress.advance)
        sizes = await asyncio.to_thread(_sizes, tmp, [f.path for f in manifest.files])
        verify(manifest, {p: (sizes[p], h) for p, h in hashes.items() if p in sizes})
        await asyncio.to_thread(_make_durable, tmp, [f.path for f in manifest.files])
        yield tmp
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, True)
        if lock is not None:
            os.close(lock)


_TMP = ".traind-restore-"
"""Marks a restore's temporary directory: ``.<tag>.traind-restore-<random>``."""


def _lock(directory: Path) -> int | None:
    """Hold an exclusive lock on ``directory`` (its descriptor, to close when done); None
    where the filesystem has no locks (such a leftover is then never removed)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_abandoned(parent: Path) -> list[Path]:
    """Remove the temporary directories in ``parent`` of restores that are not running
    (killed before they could clean up); return them."""
    removed = []
    for entry in parent.iterdir():
        if not (entry.name.startswith(".") and _TMP in entry.name) or entry.is_symlink():
            continue
        with contextlib.suppress(OSError):
            fd = _lock(entry)
            if fd is None:
                continue  # a restore in progress, or nothing to tell by
            try:
                shutil.rmtree(entry)
            finally:
                os.close(fd)
            removed.append(entry)
    return removed


def _sizes(root: Path, paths: list[str]) -> dict[str, int]:
    return {p: (root / p).stat().st_size for p in paths if (root / p).is_file()}


def _make_durable(root: Path, paths: list[str]) -> None:
    """fsync every restored file and directory, so the rename publishes data on disk: a
    power cut after it must not leave a damaged checkpoint that looks restored."""
    dirs = {""}  # relative to root, "" being root itself
    for p in paths:
        fd = os.open(os.path.join(root, p), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        parent = os.path.dirname(p)
        while parent not in dirs:  # strings: pathlib's parents cost 0.03 ms a file
            dirs.add(parent)
            parent = os.path.dirname(parent)
    for d in dirs:
        fsync_dir(root / d)

"""Make a committed multi-node checkpoint whole in this host's output_dir before a start.

Every rank of a DCP job loads ``.metadata`` and every rank's data file, but a host saved only
its own: the files of the union manifest it lacks, or holds other bytes of, are fetched,
verified by sha256, and renamed into ``output_dir/<tag>``. A file is never written into in
place: the staging snapshots hard-link the trainer's files, so a new inode takes the name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import structlog

from traind.checkpoints.restore.download import fetched, restore
from traind.layout.manifest import FileEntry, Manifest
from traind.protocol import CheckpointStore
from traind.util.fileio import fsync_dir, hash_file
from traind.util.progress import Progress

log = structlog.get_logger("traind.whole")


async def make_whole(storage: CheckpointStore, manifest: Manifest,
                     parent: Path) -> tuple[Path, int]:
    """``parent/<tag>`` holding every file of ``manifest`` with its bytes; return it and
    how many files were fetched. Missing altogether, it is restored."""
    dest = parent / manifest.tag
    if not dest.exists():
        return await restore(storage, manifest, parent), len(manifest.files)
    started = time.monotonic()
    lacking = await asyncio.to_thread(_lacking, dest, manifest.files)
    if lacking:
        part = dataclasses.replace(manifest, files=tuple(lacking))
        async with fetched(storage, part, parent, Progress(part.total_bytes)) as tmp:
            await asyncio.to_thread(_move_in, tmp, dest, [f.path for f in lacking])
    log.info("checkpoint_made_whole", tag=manifest.tag, step=manifest.step,
             fetched=len(lacking), bytes=sum(f.size for f in lacking),
             kept=len(manifest.files) - len(lacking),
             seconds=round(time.monotonic() - started, 3), backend=storage.describe,
             dest=str(dest))
    return dest, len(lacking)


def _lacking(dest: Path, files: tuple[FileEntry, ...]) -> list[FileEntry]:
    """The files of ``files`` that ``dest`` does not hold as regular files with their size
    and sha256."""
    return [entry for entry in files if not _holds(dest / entry.path, entry)]


def _holds(path: Path, entry: FileEntry) -> bool:
    if path.is_symlink() or not path.is_file() or path.stat().st_size != entry.size:
        return False
    return hash_file(path)[1] == entry.sha256


def _move_in(tmp: Path, dest: Path, paths: list[str]) -> None:
    """Rename each fetched file over its name in ``dest`` (a new inode: a snapshot's hard
    link to the old one keeps its bytes), then make the renames durable."""
    dirs = set()
    for rel in paths:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, target)
        dirs.add(target.parent)
    for d in dirs:
        fsync_dir(d)

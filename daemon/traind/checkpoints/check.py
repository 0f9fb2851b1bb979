"""Checking the store against its manifests (``traind verify``), as ``rclone check`` does:
every file of a checkpoint is read back and its size and sha256 compared; nothing changes.

Files are read through the backend's own ``download`` (its retries, ranged GETs and
hashing), one at a time into a scratch directory, each removed as soon as it is hashed: a
checkpoint of any size needs free space for its largest file only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.checkpoints.restore.download import identity
from traind.checkpoints.state.journal import Journal
from traind.errors import IntegrityError
from traind.layout.manifest import Manifest, mismatch
from traind.protocol import CheckpointStore

log = structlog.get_logger("traind.check")


@dataclass(frozen=True)
class Report:
    """What checking one stored checkpoint found: a line per file that does not match."""

    manifest: Manifest
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether every file is in the store as its manifest says."""
        return not self.problems


async def check(storage: CheckpointStore, manifest: Manifest, scratch: Path) -> Report:
    """Read every file of ``manifest`` back from ``storage`` (in a temporary directory under
    ``scratch``) and report each one missing or not matching. A store that fails otherwise
    (down, access denied) raises: that says nothing about the checkpoint."""
    started = time.monotonic()
    problems = []
    for entry in manifest.files:
        problem = await _check_file(storage, dataclasses.replace(manifest, files=(entry,)),
                                    scratch)
        if problem is not None:
            problems.append(problem)
    report = Report(manifest, tuple(problems))
    (log.info if report.ok else log.error)(
        "checkpoint_checked", tag=manifest.tag, step=manifest.step, files=len(manifest.files),
        bytes=manifest.total_bytes, problems=len(problems),
        seconds=round(time.monotonic() - started, 3), backend=storage.describe,
    )
    return report


async def remember(journal: Journal, report: Report) -> None:
    """Keep what ``check`` found for restores: a corrupt checkpoint is passed over without
    being downloaded, one that verifies again (repaired in the store) is restored again."""
    key = (report.manifest.tag, identity(report.manifest))
    if report.ok:
        await journal.forget_corrupt(*key)
    else:
        await journal.record_corrupt(*key, "; ".join(report.problems))


async def _check_file(storage: CheckpointStore, one: Manifest, scratch: Path) -> str | None:
    """The problem with the single file of ``one``, if any."""
    (entry,) = one.files
    tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=".traind-verify-", dir=scratch))
    try:
        try:
            hashes = await storage.download(one, tmp, lambda n: None)
        except IntegrityError as exc:
            return f"{entry.path}: {exc}"
        size = (await asyncio.to_thread((tmp / entry.path).stat)).st_size
        return mismatch(entry, size, hashes[entry.path])
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, True)

"""Snapshot: hard-link a checkpoint's files into the staging area (copy when impossible).

Linking takes milliseconds and keeps the data alive even when the trainer's own rotation
(``save_total_limit``) deletes the original while it is being stored. The snapshot is built
in ``<tag>.tmp`` and renamed into place, so a staged snapshot is always a whole one.
Symlinks are never followed out of the checkpoint, and only regular files are stored (a
FIFO or socket left in a checkpoint would block or fail its reading).

A link shares its file with the trainer: a trainer that saves the same checkpoint again
(torch.save and safetensors truncate and rewrite in place) changes the snapshot too. Each
file's size and mtime are kept when it is snapshot, and ``rewritten`` compares them before
a manifest is written, so such a checkpoint is snapshot again rather than committed with
files of two saves, or with hashes of bytes that are no longer its size.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from traind.checkpoints.intake.completion import Observation, Signature
from traind.checkpoints.state.journal import StagedFile, StoredFile
from traind.errors import CheckpointError, TraindError
from traind.layout.keys import check_relpath
from traind.layout.markers import EXPLICIT_MARKER


class SourceVanishedError(CheckpointError):
    """The checkpoint directory disappeared while it was being snapshot."""


class EmptyCheckpointError(CheckpointError):
    """The checkpoint directory holds no regular file (nothing to store)."""


class RewrittenError(CheckpointError):
    """Files of a snapshot changed after it was taken: the checkpoint was saved again."""

    def __init__(self, tag: str, paths: list[str]) -> None:
        super().__init__(
            f"{tag}: {', '.join(paths)} changed after the snapshot was taken (the checkpoint "
            "was written again); it is not committed"
        )
        self.tag = tag
        self.paths = paths


@dataclass(frozen=True)
class Snapshot:
    """A staged checkpoint: its files, how many could not simply be linked, what was left
    out (symlinks leading outside, FIFOs, sockets, devices), and the newest mtime among
    them (to measure detection latency)."""

    files: tuple[StagedFile, ...]
    copied: int
    skipped: tuple[str, ...]
    newest_mtime: float

    @property
    def total_bytes(self) -> int:
        """The sum of the staged files' sizes."""
        return sum(f.size for f in self.files)


def walk(root: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``root`` as (relative posix path, path to read).

    A symlink is included (as the file it points to) only when it resolves to a regular
    file inside ``root``; other symlinks and anything not a regular file (FIFO, socket,
    device) are reported with an empty ``Path()`` to read.
    """
    found: list[tuple[str, Path]] = []
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if rel == EXPLICIT_MARKER:
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                target = path.resolve()
                inside = target.is_relative_to(real_root) and target.is_file()
                found.append((rel, target if inside else Path()))
            elif stat.S_ISREG(mode):
                found.append((rel, path))
            else:
                found.append((rel, Path()))
    return found


def observe(root: Path, markers: tuple[str, ...]) -> Observation | None:
    """Scan a checkpoint directory; None when it does not exist (any more)."""
    try:
        signature: Signature = frozenset(
            (rel, (st := os.stat(path)).st_size, st.st_mtime_ns)
            for rel, path in walk(root)
            if path != Path()
        )
        has_marker = any((root / m).exists() for m in markers)
        explicit = (root / EXPLICIT_MARKER).exists()
    except FileNotFoundError:
        return None
    if not root.is_dir():
        return None
    return Observation(signature, has_marker, explicit)


def take(src: Path, dest: Path, whole: bool = False, empty_ok: bool = False) -> Snapshot:
    """Snapshot ``src`` into ``dest`` (replacing an older snapshot there). With ``whole``,
    a file that would be left out (see ``walk``) fails the snapshot instead; with
    ``empty_ok`` a directory holding no file is an empty snapshot (a host's part of a
    multi-node checkpoint that its processes wrote nothing of), else it fails."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    files: list[StagedFile] = []
    newest = 0.0
    copied = 0
    skipped: list[str] = []
    made: set[Path] = set()  # directories made in tmp: one mkdir each, not one a file
    try:
        entries = walk(src)
        if not src.is_dir():
            raise FileNotFoundError(errno.ENOENT, "checkpoint directory vanished", str(src))
        for rel, path in entries:
            if path == Path():
                skipped.append(rel)
                continue
            check_relpath(rel)
            target = tmp / rel
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            if _link_or_copy(path, target):
                copied += 1
            st = target.stat()
            newest = max(newest, st.st_mtime)
            files.append(StagedFile(rel, st.st_size, st.st_mtime_ns))
    except FileNotFoundError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceVanishedError(f"{src} vanished while being snapshot: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not files and not empty_ok:
        raise EmptyCheckpointError(f"{src} holds no file to store")
    if whole and skipped:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TraindError(
            f"{src}: {', '.join(skipped)} would be left out: only regular files, and symlinks "
            "to them inside the checkpoint, are stored; copy the data in, or remove them"
        )
    if not files:  # empty_ok: the directory itself was last written when it was marked
        tmp.mkdir(parents=True, exist_ok=True)
        newest = src.stat().st_mtime
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return Snapshot(tuple(files), copied, tuple(skipped), newest)


def rewritten(root: Path, files: list[StoredFile]) -> list[str]:
    """The files of the snapshot in ``root`` whose size or mtime is no longer what it was
    when snapshot (or that are gone); files journalled without an mtime are not checked."""
    changed = []
    for f in files:
        if f.mtime_ns is None:
            continue
        try:
            st = os.stat(root / f.path)
        except FileNotFoundError:
            changed.append(f.path)
            continue
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            changed.append(f.path)
    return changed


def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` to ``dst``; copy instead when linking is impossible. True if copied."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return False
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    shutil.copyfile(src, dst)
    return True

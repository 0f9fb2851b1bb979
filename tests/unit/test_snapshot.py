"""Snapshots: hard links where possible, copies across filesystems, symlinks never followed
out of the checkpoint, and a whole snapshot or none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.support.requires import missing
from traind.checkpoints.intake.snapshot import (
    EmptyCheckpointError,
    SourceVanishedError,
    observe,
    take,
)

from traind.errors import TraindError, UnsafePathError
from traind.layout.markers import EXPLICIT_MARKER


def checkpoint(root: Path) -> Path:
    src = root / "checkpoint-3"
    (src / "sub").mkdir(parents=True)
    (src / "model.bin").write_bytes(b"m" * 100)
    (src / "sub/opt.pt").write_bytes(b"o" * 10)
    (src / "trainer_state.json").write_text("{}")
    return src


def test_hard_links_and_file_list(tmp_path: Path) -> None:
    """Files are hard-linked (same inode) and listed with their sizes."""
    src = checkpoint(tmp_path)
    snap = take(src, tmp_path / "staging/checkpoint-3")
    assert {(f.path, f.size) for f in snap.files} == {
        ("model.bin", 100),
        ("sub/opt.pt", 10),
        ("trainer_state.json", 2),
    }
    assert snap.copied == 0
    staged = tmp_path / "staging/checkpoint-3/model.bin"
    assert staged.stat().st_ino == (src / "model.bin").stat().st_ino


def test_copies_across_filesystems(tmp_path: Path) -> None:
    """Where a hard link is impossible (another filesystem) the file is copied, and counted."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        missing("needs /dev/shm on a different filesystem than the temp dir")
    src = checkpoint(tmp_path)
    dest = shm / f"traind-test-{os.getpid()}" / "checkpoint-3"
    try:
        snap = take(src, dest)
        assert snap.copied == 3
        assert (dest / "model.bin").read_bytes() == b"m" * 100
    finally:
        import shutil

        shutil.rmtree(dest.parent, ignore_errors=True)


def test_symlinks_inside_kept_outside_skipped(tmp_path: Path) -> None:
    """A symlink to a file inside the checkpoint is stored as that file; one pointing
    outside is skipped and reported, never followed."""
    src = checkpoint(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not upload")
    (src / "alias.bin").symlink_to("model.bin")
    (src / "leak.txt").symlink_to(secret)
    (src / "dirlink").symlink_to(tmp_path)
    snap = take(src, tmp_path / "staging/checkpoint-3")
    paths = {f.path for f in snap.files}
    assert "alias.bin" in paths
    assert "leak.txt" not in paths
    assert not any(p.startswith("dirlink") for p in paths)
    assert set(snap.skipped) == {"leak.txt", "dirlink"}
    assert (tmp_path / "staging/checkpoint-3/alias.bin").read_bytes() == b"m" * 100


def test_a_whole_snapshot_refuses_what_it_would_leave_out(tmp_path: Path) -> None:
    """For ``traind push``: a symlink leading outside fails the snapshot, naming it."""
    src = checkpoint(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"w")
    (src / "model.safetensors").symlink_to(tmp_path / "weights.bin")
    with pytest.raises(TraindError, match=r"model\.safetensors would be left out"):
        take(src, tmp_path / "staging/checkpoint-3", whole=True)
    assert list((tmp_path / "staging").iterdir()) == []


def test_only_regular_files_are_taken(tmp_path: Path) -> None:
    """A FIFO (which would block its reader forever) is left out and reported."""
    src = checkpoint(tmp_path)
    os.mkfifo(src / "pipe")
    snap = take(src, tmp_path / "staging/checkpoint-3")
    assert "pipe" not in {f.path for f in snap.files}
    assert snap.skipped == ("pipe",)
    assert observe(src, ("trainer_state.json",)) is not None


def test_explicit_marker_is_not_part_of_the_checkpoint(tmp_path: Path) -> None:
    """traind's own marker completes the checkpoint but is not stored with it."""
    src = checkpoint(tmp_path)
    (src / EXPLICIT_MARKER).write_text("{}")
    seen = observe(src, ("trainer_state.json",))
    assert seen is not None
    assert seen.explicit
    snap = take(src, tmp_path / "staging/checkpoint-3")
    assert EXPLICIT_MARKER not in {f.path for f in snap.files}


def test_unsafe_file_name_rejects_the_snapshot(tmp_path: Path) -> None:
    """A file whose name cannot be a storage key fails the snapshot and leaves nothing."""
    src = checkpoint(tmp_path)
    (src / "bad\nname.bin").write_bytes(b"x")
    with pytest.raises(UnsafePathError, match=r"^unsafe relative path 'bad\\nname\.bin': control"):
        take(src, tmp_path / "staging/checkpoint-3")
    assert not (tmp_path / "staging/checkpoint-3").exists()
    assert not (tmp_path / "staging/checkpoint-3.tmp").exists()


@pytest.mark.parametrize("name", ["traind-part-0.json", "traind-writer-1.json",
                                  "traind-part-x.json"])
def test_a_file_named_like_a_part_or_part_claim_fails_the_snapshot(
    tmp_path: Path, name: str
) -> None:
    """A checkpoint holding a file under a name traind keeps its parts or part claims under
    fails loudly, naming the file, and nothing is staged."""
    src = checkpoint(tmp_path)
    (src / name).write_text("{}")
    with pytest.raises(UnsafePathError, match=f"may not contain a file named {name}"):
        take(src, tmp_path / "staging/checkpoint-3")
    assert not (tmp_path / "staging/checkpoint-3").exists()


def test_spaces_and_unicode_in_file_names_are_snapshot(tmp_path: Path) -> None:
    """Files named with spaces, non-ASCII letters or quotes are staged like any other."""
    src = checkpoint(tmp_path)
    names = ["a b.bin", "ü/ñ.json", "q'\"$x`.bin"]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    snap = take(src, tmp_path / "staging/checkpoint-3")
    assert set(names) <= {f.path for f in snap.files}
    assert all((tmp_path / "staging/checkpoint-3" / n).read_bytes() == n.encode() for n in names)


def test_a_checkpoint_without_files_is_refused(tmp_path: Path) -> None:
    """Nothing to store (only traind's own marker) is said as such."""
    src = tmp_path / "checkpoint-4"
    src.mkdir()
    (src / EXPLICIT_MARKER).write_text("{}")
    with pytest.raises(EmptyCheckpointError, match="holds no file to store"):
        take(src, tmp_path / "staging/checkpoint-4")
    assert not (tmp_path / "staging").exists()


def test_an_empty_part_is_an_empty_snapshot_where_allowed(tmp_path: Path) -> None:
    """With empty_ok (a host's part of a multi-node checkpoint) a directory holding only
    traind's marker is staged as an empty snapshot, dated when it was marked."""
    src = tmp_path / "checkpoint-4"
    src.mkdir()
    (src / EXPLICIT_MARKER).write_text("{}")
    snap = take(src, tmp_path / "staging/checkpoint-4", empty_ok=True)
    assert (snap.files, snap.total_bytes) == ((), 0)
    assert snap.newest_mtime == src.stat().st_mtime
    assert list((tmp_path / "staging/checkpoint-4").iterdir()) == []


def test_vanished_source(tmp_path: Path) -> None:
    """A directory that is gone is reported as vanished, not as an empty checkpoint."""
    with pytest.raises(SourceVanishedError):
        take(tmp_path / "checkpoint-9", tmp_path / "staging/checkpoint-9")
    assert observe(tmp_path / "checkpoint-9", ("trainer_state.json",)) is None


def test_retake_replaces_the_old_snapshot(tmp_path: Path) -> None:
    """A re-snapshot after a change replaces the staged copy whole."""
    src = checkpoint(tmp_path)
    dest = tmp_path / "staging/checkpoint-3"
    take(src, dest)
    (src / "sub/opt.pt").unlink()
    (src / "new.bin").write_bytes(b"n")
    snap = take(src, dest)
    assert {f.path for f in snap.files} == {"model.bin", "new.bin", "trainer_state.json"}
    assert not (dest / "sub/opt.pt").exists()

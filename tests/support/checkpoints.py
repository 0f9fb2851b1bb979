"""Synthetic checkpoints and local-store inspection for daemon tests."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.support.daemon import write_config

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal
from traind.layout.manifest import FileEntry
from traind.protocol import CheckpointStore

ONE_FILE = FileEntry("weights.bin", 1, hashlib.sha256(b"w").hexdigest())
"""The one small file of a checkpoint a test commits by hand (a manifest lists one at least)."""

def write_checkpoint(
    out: Path, step: int, size: int = 64 * 1024, nfiles: int = 2
) -> dict[str, str]:
    """Write a checkpoint like transformers does (marker last); return path → sha256."""
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    hashes = {}
    for i in range(nfiles):
        data = os.urandom(size)
        (d / f"shard-{i}.bin").write_bytes(data)
        hashes[f"shard-{i}.bin"] = hashlib.sha256(data).hexdigest()
    state = json.dumps({"global_step": step}).encode()
    (d / "trainer_state.json").write_bytes(state)
    hashes["trainer_state.json"] = hashlib.sha256(state).hexdigest()
    return hashes


def stored(store: Path, run: str) -> dict[str, dict[str, str]]:
    """Committed checkpoints in a local store: tag → {path: sha256} from the manifests."""
    out = {}
    for m in sorted((store / run).glob("*/traind-manifest.json")):
        body = json.loads(m.read_text())
        out[body["tag"]] = {f["path"]: f["sha256"] for f in body["files"]}
    return out


def setup(
    tmp_path: Path, extra: str = "", storage_extra: str = "", storage: str | None = None
) -> tuple[Path, Path, Path]:
    """A run's output dir, local store and config under ``tmp_path``; ``storage`` (a
    ``[storage]`` section's keys) replaces the local store."""
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    cfg = write_config(
        tmp_path / "traind.toml",
        run="exp",
        output_dir=out,
        state_dir=tmp_path / "state",
        storage=storage or f'type = "local"\npath = "{store}"\n{storage_extra}',
        extra=extra,
    )
    return out, store, cfg


def swap_storage(cfg: Path, storage: str) -> None:
    """Replace the ``[storage]`` section of the config at ``cfg`` with ``storage``'s keys."""
    text = cfg.read_text()
    start, end = text.index("[storage]"), text.index("[retention]")
    cfg.write_text(text[:start] + "[storage]\n" + storage + "\n" + text[end:])


def rewrite(path: Path, data: bytes) -> str:
    """Write ``data`` over ``path`` in place (same inode, as torch.save does); its sha256."""
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def run_in(tmp_path: Path) -> RunIdentity:
    """The run of a test's journal: ``r``, writing its checkpoints to tmp_path/out."""
    return RunIdentity("r", tmp_path / "out")


async def commit_through_streamer(tmp_path: Path, store: CheckpointStore, step: int) -> Journal:
    """Write checkpoint-``step`` in tmp_path/out and commit it as the daemon would."""
    journal = Journal.in_state_dir(tmp_path / "state", run_in(tmp_path))
    streamer = Streamer("r", tmp_path / "state", store, journal)
    write_checkpoint(tmp_path / "out", step)
    tag = f"checkpoint-{step}"
    await streamer.stage(tag, step, tmp_path / "out" / tag)
    await journal.set_state(tag, "ready")
    await streamer.commit(tag)
    return journal


async def one_file(store: CheckpointStore, tag: str) -> tuple[FileEntry, ...]:
    """Store ``ONE_FILE`` under ``tag`` (on a store that does not stage what it is put):
    the files of a manifest a test commits by hand."""
    await store.objects.put(f"{tag}/{ONE_FILE.path}", b"w")
    return (ONE_FILE,)

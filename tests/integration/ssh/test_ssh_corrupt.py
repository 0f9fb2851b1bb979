"""A checkpoint damaged on the SSH host, in every transfer mode: a missing file fails its
download as an integrity error naming it, ``check`` reports it, and a restore falls back to
the next older checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.sshd import SSHServer
from traind.checkpoints.restore.download import restore_newest
from traind.checkpoints.restore.verify import check
from traind.checkpoints.state.journal import Journal

from traind.errors import IntegrityError
from traind.layout.manifest import Manifest
from traind.storage import LocalFile

Checkpoint = Callable[[str, dict[str, bytes]], tuple[Path, list[LocalFile]]]
Store = Callable[..., Awaitable[Manifest]]


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
async def test_a_missing_remote_file_is_an_integrity_error(
    transfer: str, sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint,
    store: Store, journal: Journal, remote: Path, tmp_path: Path,
) -> None:
    """A file gone from the host fails the download as not matching the manifest (not as a
    store that failed): ``check`` names it and the restore passes over its checkpoint."""
    backend = make_backend(sshd, transfer=transfer)
    contents = {"weights.bin": os.urandom(100_000), "trainer_state.json": b"{}"}
    async with asyncio.timeout(30):
        older = await store(backend, "checkpoint-1", *checkpoint("checkpoint-1", contents))
        newer = await store(backend, "checkpoint-2", *checkpoint("checkpoint-2", contents))
        newer = dataclasses.replace(newer, step=2)  # the fixture commits step 1
        (remote / "store/run1/checkpoint-2/weights.bin").unlink()
        with pytest.raises(IntegrityError, match=r"checkpoint-2/weights\.bin: missing"):
            await backend.download(newer, tmp_path / "one", lambda n: None)
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        report = await check(backend, newer, scratch)
        restored = await restore_newest(backend, [older, newer], tmp_path / "out", journal)
    assert [p.split(":")[0] for p in report.problems] == ["weights.bin"]
    assert restored == older
    assert (tmp_path / "out/checkpoint-1/weights.bin").read_bytes() == contents["weights.bin"]
    assert [tag for tag, _ in await journal.corrupt()] == ["checkpoint-2"]

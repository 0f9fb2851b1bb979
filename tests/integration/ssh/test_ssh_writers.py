"""Two writers, one namespace, over SFTP to a real sshd: a tag is one writer's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.integration.ssh.conftest import MakeBackend
from tests.support.checkpoints import one_file
from tests.support.sshd import SSHServer
from tests.support.writers import check_one_writer_each, close, race

from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.manifest import Manifest, Writer
from traind.protocol.ownership import ConflictError


@pytest.mark.parametrize("transfer", ["sftp", "rsync"])
async def test_two_streamers_same_tags_one_writer_each(
    transfer: str, sshd: SSHServer, make_backend: MakeBackend, tmp_path: Path,
) -> None:
    """Two writers racing for checkpoint-1..3 over SSH: each tag one writer's, whole and
    restorable; the other told, its copies kept (rsync mode claims over SFTP too)."""
    stores = (make_backend(sshd, transfer=transfer), make_backend(sshd, transfer=transfer))
    sides = await race(tmp_path, stores)
    try:
        await check_one_writer_each(sides, make_backend(sshd), tmp_path)
    finally:
        close(sides)
    links = [op for op in sshd.sftp_operations()
             if op.startswith("hardlink") and op.endswith(f'{CLAIM_NAME}"')]
    assert len(links) >= 3  # the claims were exclusive creates by hard link


async def test_racing_claims_exactly_one_wins(
    sshd: SSHServer, make_backend: MakeBackend,
) -> None:
    """Eight writers (own connections) claiming one tag at once: one wins, the rest conflict."""
    writers = [Writer(f"{n:032x}", f"host-{n}") for n in range(8)]
    stores = [make_backend(sshd) for _ in writers]
    async with asyncio.timeout(60):
        results = await asyncio.gather(
            *(s.claim("checkpoint-9", w) for s, w in zip(stores, writers, strict=True)),
            return_exceptions=True)
    winners = [w for w, r in zip(writers, results, strict=True) if r is None]
    assert len(winners) == 1, results
    assert all(isinstance(r, ConflictError) and r.theirs == str(winners[0])
               for r in results if r is not None)


async def test_manifest_is_created_once_and_probe_says_so(
    sshd: SSHServer, make_backend: MakeBackend, remote: Path,
) -> None:
    """Over SFTP a commit never replaces another writer's manifest, a retry of its own
    may; the probe reports the exclusive create; delete goes manifest, objects, claim."""
    store = make_backend(sshd)
    a, b = Writer("a" * 32, "host-a"), Writer("b" * 32, "host-b")
    async with asyncio.timeout(30):
        assert (await store.probe()).startswith("exclusive create over SFTP")
        await store.claim("checkpoint-1", a)
        files = await one_file(store, "checkpoint-1")
        await store.commit(Manifest("run1", "checkpoint-1", 1, files, writer=a))
        with pytest.raises(ConflictError):
            await store.commit(Manifest("run1", "checkpoint-1", 1, files, writer=b))
        await store.commit(Manifest("run1", "checkpoint-1", 1, files, writer=a))
        assert [m.writer for m in await store.manifests()] == [a]
        tag_dir = remote / "store" / "run1" / "checkpoint-1"
        (tag_dir / "sub").mkdir()
        for rel in ("a.bin", "z.bin", "sub/b.bin"):
            (tag_dir / rel).write_bytes(b"data")
        before = len(sshd.sftp_operations())
        await store.delete("checkpoint-1")
    assert list((remote / "store" / "run1").iterdir()) == []
    removed = [op.split('"')[1].removeprefix(f"{tag_dir}/")
               for op in sshd.sftp_operations()[before:] if op.startswith("remove")]
    assert removed[0] == MANIFEST_NAME
    assert removed[-1] == CLAIM_NAME  # the tag stays claimed until its objects are gone
    assert sorted(removed[1:-1]) == ["a.bin", "sub/b.bin", "weights.bin", "z.bin"]

"""The SSH store's primitives against a real sshd, beyond the shared conformance suite: what
lands on the remote side, in which SFTP operations, and what is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.sshd import SSHServer

from traind.storage.base import CREATE, update


def _ops(sshd: SSHServer, since: int, *kinds: str) -> list[str]:
    """The server's SFTP operations of ``kinds`` after the first ``since``."""
    return [op for op in sshd.sftp_operations()[since:] if op.startswith(kinds)]


async def test_puts_make_their_directories_and_leave_no_temporary_files(
    sshd: SSHServer, make_store: Callable[..., Any], remote: Path
) -> None:
    """A put into a directory not there yet creates it; an overwrite is renamed into place,
    a create-only put linked; nothing but the objects is left on the host."""
    objects = make_store(sshd)
    run = remote / "store" / "run1"
    async with asyncio.timeout(30):
        before = len(sshd.sftp_operations())
        await objects.put("t/deep/er/a.json", b"one")
        renamed = _ops(sshd, before, "posix-rename")
        before = len(sshd.sftp_operations())
        assert await objects.put("t/deep/b.json", b"two", CREATE)
        linked = _ops(sshd, before, "hardlink")
        assert not await objects.put("t/deep/b.json", b"again", CREATE)
        found = await objects.get("t/deep/er/a.json")
        assert found is not None
        assert await objects.put("t/deep/er/a.json", b"three", update(found.version))
    assert [op.rsplit('"', 2)[1] for op in renamed] == [str(run / "t/deep/er/a.json")]
    assert [op.rsplit('"', 2)[1] for op in linked] == [str(run / "t/deep/b.json")]
    assert {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*")
            if p.is_file()} == {"t/deep/er/a.json": b"three", "t/deep/b.json": b"two"}


async def test_two_writers_replacing_one_object_never_mix_it(
    sshd: SSHServer, make_store: Callable[..., Any]
) -> None:
    """Two hosts overwriting one key at the same instant, again and again: every read finds
    one writer's bytes whole, never a mix (each write has a temporary name of its own)."""
    one, two = make_store(sshd), make_store(sshd)
    bodies = {b"a" * 70_000, b"b" * 10}
    async with asyncio.timeout(60):
        for _ in range(20):
            await asyncio.gather(one.put("t/lease.json", b"a" * 70_000),
                                 two.put("t/lease.json", b"b" * 10))
            found = await one.get("t/lease.json")
            assert found is not None
            assert found.data in bodies
        left = [m.key for m in await one.list("t/")]
    assert left == ["t/lease.json"]


async def test_listing_walks_every_depth_and_delete_prunes_to_the_root(
    sshd: SSHServer, make_store: Callable[..., Any], remote: Path
) -> None:
    """``list`` finds files at any depth (with sizes and mtimes), only under its prefix;
    ``delete`` removes directories its keys leave empty but never the run's root."""
    objects = make_store(sshd)
    keys = ["a/1", "a/x/2", "a/x/y/z/3", "ab/4", "b/5"]
    async with asyncio.timeout(30):
        for key in keys:
            await objects.put(key, key.encode())
        under_a = sorted((m.key, m.size) for m in await objects.list("a/"))
        named_a = sorted(m.key for m in await objects.list("a"))
        stamped = all(m.modified for m in await objects.list(""))
        assert await objects.list("none/") == []
        assert await objects.list_dirs("none/") == []
        assert await objects.list_dirs("a/x/") == ["y"]
        await objects.delete(["a/1", "a/x/2", "a/x/y/z/3", "ab/4", "b/5"])
        dirs = await objects.list_dirs()
    assert under_a == [("a/1", 3), ("a/x/2", 5), ("a/x/y/z/3", 9)]
    assert named_a == ["a/1", "a/x/2", "a/x/y/z/3", "ab/4"]
    assert stamped
    assert dirs == []
    assert list((remote / "store").iterdir()) == [remote / "store" / "run1"]


async def test_capabilities_are_found_once_without_a_probe(
    sshd: SSHServer, make_store: Callable[..., Any], remote: Path
) -> None:
    """Asked before any probe, the store checks its exclusive create once (a second
    create of one name refused), remembers it, and leaves nothing behind."""
    objects = make_store(sshd)
    async with asyncio.timeout(30):
        first = await asyncio.gather(*(objects.capabilities() for _ in range(3)))
        before = len(sshd.sftp_operations())
        again = await objects.capabilities()
    assert {(c.create, c.update) for c in [*first, again]} == {(True, False)}
    assert len(sshd.sftp_operations()) == before
    probes = [op for op in sshd.sftp_operations() if op.startswith("hardlink")]
    assert len(probes) == 2  # one check: a create, and the create refused
    assert [p.name for p in (remote / "store" / "run1").iterdir()] == []

"""Parts of a multi-node checkpoint on S3: one claim per node rank, files never written over
another host's, part manifests beside the files, and their ranks from one listing.

A part claim ``<tag>/traind-writer-<rank>.json`` is created with ``If-None-Match: *`` where
the store honours it, else by the listing protocol of ``claim`` (each claimant puts
``<tag>/traind-claims-<rank>/<id>.json``, lists them, and withdraws unless alone). A file
whose key is stored already (another host saved the same path) is compared by its bytes,
not sent; two hosts sending one path at the same instant both store it, and the committing
host's ``union`` of their part manifests (each with its own sha256) refuses the checkpoint
when the bytes differ.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

from traind.errors import ConflictError, TransientStorageError
from traind.layout.keys import CLAIM_NAME, PART_CLAIM_PREFIX, PART_PREFIX, check_relpath
from traind.layout.manifest import Writer
from traind.layout.parts import Part, PartsDisagreeError, part_claim_name, part_name, part_rank
from traind.storage.base import LocalFile, UploadSession
from traind.storage.claim import check_claim
from traind.storage.fileio import hash_file
from traind.storage.s3.claim import get, put_new
from traind.storage.s3.client import Ops
from traind.storage.tasks import fan_out

CHUNK = 1024 * 1024
"""Bytes read at a time when a stored object is hashed to compare it with this host's."""


def _claimants_dir(rank: int) -> str:
    return f"traind-claims-{rank}/"


async def listing(ops: Ops, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` with its size: one request per 1000 keys. A throttled or
    failing page is retried by ``Ops.call`` and raised when retries run out, never read as
    an empty listing."""
    return {str(obj["Key"]): int(obj.get("Size", 0)) async for page in ops.pages(prefix)
            for obj in page.get("Contents", [])}


async def claim_part(ops: Ops, base: str, tag: str, rank: int, writer: Writer,
                     conditional: bool, where: str) -> None:
    """Take node ``rank``'s part of the tag under ``base`` for ``writer``; ConflictError when
    another writer holds it, or a single writer holds the whole tag (checked after ours
    exists; a single writer checks for part claims after its own, so one sees the other)."""
    key = base + part_claim_name(rank)
    body = writer.to_json()
    if conditional:
        made = await put_new(ops, key, body, conditional=True)
    else:
        made = await get(ops, key) is None
        if made:
            await _claim_listed(ops, base, tag, rank, writer, where)
            await put_new(ops, key, body, conditional=False)
    if not made:
        found = await get(ops, key)
        if found is None:  # deleted (pruned) meanwhile: the next attempt finds it free
            raise TransientStorageError(f"{tag}: the part claim in {where} vanished; retrying")
        check_claim(tag, writer, Writer.from_json(found), where + part_claim_name(rank))
    whole = await get(ops, base + CLAIM_NAME)
    if whole is not None:
        if made:
            await ops.call("delete_object", key)
        raise ConflictError(tag, str(writer), str(Writer.from_json(whole)), where + CLAIM_NAME)


async def _claim_listed(ops: Ops, base: str, tag: str, rank: int, writer: Writer,
                        where: str) -> None:
    claimants = base + _claimants_dir(rank)
    mine = f"{claimants}{writer.id}.json"
    await put_new(ops, mine, writer.to_json(), conditional=False)
    if any(key != mine for key in await listing(ops, claimants)):
        await ops.call("delete_object", mine)
        raise TransientStorageError(f"{tag}: two writers claimed node {rank}'s part at once "
                                    f"in {where}; retrying")


async def part_claim(ops: Ops, base: str, rank: int) -> Writer | None:
    """Who holds node ``rank``'s part of the tag under ``base``, or None."""
    found = await get(ops, base + part_claim_name(rank))
    return Writer.from_json(found) if found is not None else None


async def any_part_claim(ops: Ops, base: str) -> Writer | None:
    """A writer holding some node's part of the tag under ``base`` (one listing), if any."""
    page = await ops.call("list_objects_v2", Prefix=base + PART_CLAIM_PREFIX, MaxKeys=1)
    for obj in page.get("Contents", []):
        if (found := await get(ops, str(obj["Key"]))) is not None:
            return Writer.from_json(found)
    return None


async def keep_stored(ops: Ops, base: str, tag: str, root: Path, files: Sequence[LocalFile],
                      session: UploadSession, where: str) -> list[LocalFile]:
    """Report the ``files`` another host stored already with these bytes as done; return
    the ones still to send. PartsDisagreeError when a stored one has other bytes."""
    stored = await listing(ops, base)
    todo = []
    for f in files:
        key = base + check_relpath(f.path)
        if key not in stored:
            todo.append(f)
            continue
        _, sha = await asyncio.to_thread(hash_file, root / f.path)
        there = await _stored_sha256(ops, key) if stored[key] == f.size else None
        if there != sha:
            theirs = f"sha256 {there[:12]}…" if there else f"{stored[key]} bytes"
            ours = f"sha256 {sha[:12]}…" if there else f"{f.size} bytes"
            raise PartsDisagreeError(
                f"{tag}: {f.path} in the store ({where}{f.path}) differs from this host's "
                f"({theirs} != {ours}); another node saved other bytes under the same path")
        session.advance(f.size)
        await session.file_done(f.path, sha)
    return todo


async def _stored_sha256(ops: Ops, key: str) -> str:
    resp = await ops.call("get_object", key)
    digest = hashlib.sha256()
    async with resp["Body"] as body:
        while chunk := await body.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


async def commit_part(ops: Ops, base: str, part: Part) -> None:
    """Put ``part``'s manifest beside its files."""
    await put_new(ops, base + part_name(part.node_rank), part.to_json(), conditional=False)


async def part_ranks(ops: Ops, base: str) -> set[int]:
    """The node ranks with a part manifest under ``base``: one listing of their names."""
    names = (key[len(base):] for key in await listing(ops, base + PART_PREFIX))
    return {rank for name in names if (rank := part_rank(name)) is not None}


async def parts(ops: Ops, base: str, concurrency: int) -> list[Part]:
    """Every part manifest under ``base``: one listing, then ``concurrency`` reads at once."""
    keys = sorted(base + part_name(rank) for rank in await part_ranks(ops, base))

    async def read(key: str) -> Part | None:
        data = await get(ops, key)
        return None if data is None else Part.from_json(data)

    return [p for p in await fan_out(keys, concurrency, read) if p is not None]

"""Parts of a multi-node checkpoint: one claim per node rank, files never sent over another
host's, a part manifest beside the files, and the ranks stored from one listing.

A part claim ``<tag>/traind-writer-<rank>.json`` is the store's create-only put (or the
listing protocol, claimants under ``<tag>/traind-claims-<rank>/``). A file another host
stored already is compared by its bytes, not sent again; two hosts sending one path at the
same instant both store it, and the union of their part manifests (each with its sha256)
refuses the checkpoint when the bytes differ.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

from traind.errors import TransientStorageError
from traind.layout.keys import (
    AGREEMENT_DIR,
    CLAIM_NAME,
    MANIFEST_NAME,
    PART_CLAIM_PREFIX,
    PART_PREFIX,
    check_relpath,
    check_tag,
)
from traind.layout.manifest import Unreadable, Writer, listed
from traind.layout.parts import Part, PartsDisagreeError, part_claim_name, part_name, part_rank
from traind.protocol import listing_claims as claimants
from traind.protocol.commit import read_manifest, staging, verify_stored
from traind.protocol.ownership import ConflictError, check_claim
from traind.storage.base import LocalFile, ObjectStore, UploadSession
from traind.util.fileio import hash_file
from traind.util.tasks import fan_out

CHUNK = 8 * 1024 * 1024
"""Bytes read at a time when a stored file is hashed to compare it with this host's."""


async def claim_part(store: ObjectStore, run: str, tag: str, rank: int,
                     writer: Writer) -> None:
    """Take node ``rank``'s part of ``tag`` of ``run`` for ``writer``; ConflictError when
    another writer holds it, or a single writer holds the whole tag (checked after ours
    exists; a single writer checks for part claims after its own, so one sees the other)."""
    base = f"{check_tag(tag)}/"
    key = base + part_claim_name(rank)
    made = await claimants.create(store, key, writer.to_json(),
                                  f"{base}{claimants.CLAIMANTS.rstrip('/')}-{rank}/", tag,
                                  writer)
    if not made:
        found = await store.get(key)
        if found is None:  # deleted (pruned) meanwhile: the next attempt finds it free
            raise TransientStorageError(f"{tag}: the part claim {store.where(key)} vanished; "
                                        "retrying")
        check_claim(tag, writer, Writer.from_json(found.data), store.where(key))
    holder = await _single_writer(store, run, tag) if made else None
    if holder is None and (whole := await store.get(base + CLAIM_NAME)) is not None:
        holder = Writer.from_json(whole.data)
    if holder is not None:
        if made:
            await store.delete([key])
        raise ConflictError(tag, str(writer), str(holder), store.where(base))


async def _single_writer(store: ObjectStore, run: str, tag: str) -> Writer | None:
    """The single writer that committed ``tag`` on a store with no claim objects (it
    stages what it is sent), else None."""
    if not (await store.capabilities()).staged:
        return None
    committed = await read_manifest(store, run, tag)
    return None if committed is None else committed.writer


async def part_claim(store: ObjectStore, tag: str, rank: int) -> Writer | None:
    """Who holds node ``rank``'s part of ``tag``; None when nobody (never claimed, or the
    checkpoint was deleted since)."""
    found = await store.get(f"{check_tag(tag)}/{part_claim_name(rank)}")
    return None if found is None else Writer.from_json(found.data)


async def any_part_claim(store: ObjectStore, tag: str) -> Writer | None:
    """A writer holding some node's part of ``tag`` (one listing), if any."""
    prefix = f"{check_tag(tag)}/{PART_CLAIM_PREFIX}"
    for meta in sorted(await store.list(prefix), key=lambda m: m.key):
        if meta.key.endswith(".json") and (found := await store.get(meta.key)) is not None:
            return Writer.from_json(found.data)
    return None


async def upload_part(store: ObjectStore, tag: str, root: Path, files: Sequence[LocalFile],
                      session: UploadSession) -> None:
    """Send this host's ``files`` of ``tag``, never over another host's: a path stored
    already is kept when its bytes are these (reported done), PartsDisagreeError if not."""
    base = f"{check_tag(tag)}/"
    stored = {m.key[len(base):]: m.size for m in await store.list(base)}
    todo = []
    for f in files:
        if check_relpath(f.path) not in stored:
            todo.append(f)
            continue
        _, sha = await asyncio.to_thread(hash_file, root / f.path)
        there = await _stored_sha256(store, base + f.path) if stored[f.path] == f.size else None
        if there != sha:
            theirs = f"sha256 {there[:12]}…" if there else f"{stored[f.path]} bytes"
            ours = f"sha256 {sha[:12]}…" if there else f"{f.size} bytes"
            raise PartsDisagreeError(
                f"{tag}: {f.path} in the store ({store.where(base + f.path)}) differs from "
                f"this host's ({theirs} != {ours}); another node saved other bytes under the "
                "same path")
        session.advance(f.size)
        await session.file_done(f.path, sha)
    if todo:
        await store.send(base, root, todo, session)
    if todo and (await store.capabilities()).staged and not await staging(store).publish(
            base, todo, f"files of a part of {tag}", unless=base + MANIFEST_NAME):
        raise ConflictError(tag, "this job", "the writer that committed it", store.where(base))


async def _stored_sha256(store: ObjectStore, key: str) -> str:
    digest = hashlib.sha256()
    offset = 0
    while True:
        chunk = await store.get_range(key, offset, offset + CHUNK)
        digest.update(chunk)
        offset += len(chunk)
        if len(chunk) < CHUNK:  # the object's end
            return digest.hexdigest()


async def commit_part(store: ObjectStore, part: Part) -> None:
    """Check this part's files are stored, then write its manifest beside them."""
    await verify_stored(store, part.tag, part.files)
    await store.put(f"{check_tag(part.tag)}/{part_name(part.node_rank)}", part.to_json())


async def part_ranks(store: ObjectStore, tag: str) -> set[int]:
    """The node ranks whose part manifest of ``tag`` is stored: names only, one listing."""
    base = f"{check_tag(tag)}/"
    return {rank for m in await store.list(base + PART_PREFIX)
            if (rank := part_rank(m.key[len(base):])) is not None}


async def parts(store: ObjectStore, run: str, tag: str, concurrency: int) -> list[Part]:
    """Every part manifest stored for ``tag`` of ``run``, but those malformed or naming
    another place (``listed``): one listing, then the reads at once."""
    keys = [f"{check_tag(tag)}/{part_name(r)}" for r in sorted(await part_ranks(store, tag))]

    async def read(key: str) -> Part | Unreadable | None:
        found = await store.get(key)
        return None if found is None else listed(found.data, store.where(key), run, tag,
                                                 Part.from_json)

    return [p for p in await fan_out(keys, concurrency, read) if isinstance(p, Part)]


async def uncommitted(store: ObjectStore, run: str, concurrency: int
                      ) -> dict[str, list[Part]]:
    """Every tag of ``run`` holding part manifests and no manifest, with its parts: node 0
    looks for checkpoints whose parts never all arrive (a host died for good)."""
    tags = [t for t in await store.list_dirs() if t != AGREEMENT_DIR]

    async def look(tag: str) -> list[Part]:
        try:
            check_tag(tag)
        except ValueError:
            return []
        if not await part_ranks(store, tag) or await store.head(f"{tag}/{MANIFEST_NAME}"):
            return []
        return await parts(store, run, tag, concurrency)

    found = await fan_out(tags, concurrency, look)
    return {tag: p for tag, p in zip(tags, found, strict=True) if p}

"""The checkpoint as the store holds it: the check that every file is there, the manifest
written last (the commit), the committed manifests listed, and a checkpoint deleted.

A checkpoint exists only when ``<tag>/traind-manifest.json`` does. Before writing it the
store is listed under the tag, and every file of the manifest must be there with its size:
what a transfer tool reported (rsync exiting 0) is not proof; a temporary file a killed
writer left there is removed. On a store that stages what it is sent (the Hub) the files
and the manifest become visible in one change, the store checking the staged bytes first.
Deleting removes a multi-node checkpoint's part manifests first (a host whose part waited
then finds it gone rather than committing the union anew), then the manifest, then the
objects, the claims last, so no other writer takes the tag meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from traind.errors import IntegrityError, MissingFilesError
from traind.layout.keys import (
    AGREEMENT_DIR,
    CLAIM_NAME,
    MANIFEST_NAME,
    PART_CLAIM_PREFIX,
    PART_PREFIX,
    check_tag,
)
from traind.layout.manifest import FileEntry, Manifest, Unreadable, listed, located, unreadable
from traind.layout.parts import part_rank
from traind.protocol.listing_claims import CLAIMANTS
from traind.protocol.ownership import ConflictError, check_committed, is_claim_file
from traind.storage.base import CREATE, OVERWRITE, LocalFile, ObjectStore, StagingStore
from traind.util.fileio import PART_SUFFIX
from traind.util.tasks import fan_out


async def read_manifest(store: ObjectStore, run: str, tag: str) -> Manifest | None:
    """The manifest of ``tag`` of ``run`` when it is committed: one small read (a manifest
    there of another run or tag, a copy, is none: ``located``). IntegrityError when it is
    malformed."""
    key = f"{check_tag(tag)}/{MANIFEST_NAME}"
    found = await store.get(key)
    return None if found is None else located(Manifest.from_json(found.data), run, tag,
                                              store.where(key))


async def verify_stored(store: ObjectStore, tag: str, files: Iterable[FileEntry]) -> set[str]:
    """Raise MissingFilesError unless every one of ``files`` is stored under ``tag`` with
    its size (one listing of the tag); return every name listed there."""
    base = f"{check_tag(tag)}/"
    stored = {m.key[len(base):]: m.size for m in await store.list(base)}
    if missing := [f.path for f in files if stored.get(f.path) != f.size]:
        raise MissingFilesError(tag, missing, store.where(base))
    return set(stored)


def local_files(files: Iterable[FileEntry]) -> list[LocalFile]:
    """The files of a manifest as a store names them."""
    return [LocalFile(f.path, f.size) for f in files]


def staging(store: ObjectStore) -> StagingStore:
    """``store``, whose capabilities say it stages what it is sent, as the store it is."""
    assert isinstance(store, StagingStore), f"{store.describe} stages files: it has publish"
    return store


async def commit(store: ObjectStore, run: str, manifest: Manifest, union: bool = False) -> None:
    """Check the files are stored, then write the manifest, never over one already there
    unless its writer is this manifest's (a retried commit): after this the checkpoint
    exists. ``union``: the manifest of a multi-node job's parts, whose claims are there.
    ``run``: the store's, which the manifest must name (else no listing would find it); and
    it names its writer (else a listing refuses it as malformed)."""
    if manifest.run != run:
        raise ValueError(f"a manifest of run {manifest.run!r} is not committed in the store "
                         f"of run {run!r}")
    if (writer := manifest.writer) is None:
        raise ValueError(f"a manifest of {manifest.tag} naming no writer is not committed")
    key = f"{check_tag(manifest.tag)}/{MANIFEST_NAME}"
    body = manifest.to_json()
    caps = await store.capabilities()
    if caps.staged:  # one change: the files with the manifest, the first writer's
        base = f"{manifest.tag}/"
        if not await staging(store).publish(
                base, local_files(manifest.files), f"commit {manifest.tag} of writer "
                f"{writer}", key=key, data=body,
                unless=None if union else base + PART_CLAIM_PREFIX):
            found = await read_manifest(store, run, manifest.tag)
            check_committed(manifest.tag, writer, found, store.where(key))
            if found is None:  # refused for the parts a multi-node job's hosts claimed
                raise ConflictError(manifest.tag, str(writer), "a multi-node job",
                                    store.where(base))
        return
    names = await verify_stored(store, manifest.tag, manifest.files)
    kept = {f.path for f in manifest.files}
    if strays := sorted(n for n in names if n not in kept and _temporary_of(n, kept)):
        # What a killed writer was writing of these files (no other writes of them now: the
        # tag is this writer's, or every part of it is stored); a losing writer's claim
        # being written is not one of them.
        await store.delete([f"{manifest.tag}/{n}" for n in strays])
    if caps.create and await store.put(key, body, CREATE):
        return
    check_committed(manifest.tag, writer, await read_manifest(store, run, manifest.tag),
                    store.where(key))
    await store.put(key, body, OVERWRITE)  # none there, or our own retried: these objects


def _temporary_of(name: str, files: set[str]) -> bool:
    """Whether ``name`` is a temporary name one of ``files`` was written under
    (``<file>.traind-part``, ``<file>.<token>.traind-part``)."""
    if not name.endswith(PART_SUFFIX):
        return False
    target = name.removesuffix(PART_SUFFIX)
    return target in files or target.rsplit(".", 1)[0] in files


@dataclass(frozen=True)
class Listing:
    """The committed checkpoints of a run, and the manifests found that could not be read
    (``traind verify --all`` fails on those)."""

    manifests: list[Manifest]
    unreadable: list[Unreadable]


async def listing(store: ObjectStore, run: str, concurrency: int) -> Listing:
    """Every committed checkpoint of ``run`` (a tag without a manifest is not one, nor is
    one whose manifest is malformed or names another place: ``listed``): one listing of the
    tags, then ``concurrency`` manifest reads at once."""
    tags = [t for t in await store.list_dirs() if t != AGREEMENT_DIR and _is_tag(t)]

    async def read(tag: str) -> Manifest | Unreadable | None:
        key = f"{tag}/{MANIFEST_NAME}"
        try:
            found = await store.get(key)
        except IntegrityError as exc:  # a link, a FIFO or a directory as the manifest
            return unreadable(store.where(key), exc)
        return None if found is None else listed(found.data, store.where(key), run, tag,
                                                 Manifest.from_json)

    found = await fan_out(tags, concurrency, read)
    return Listing([m for m in found if isinstance(m, Manifest)],
                   [u for u in found if isinstance(u, Unreadable)])


def _is_tag(name: str) -> bool:
    try:
        check_tag(name)
    except ValueError:
        return False  # not a directory of ours
    return True


async def delete(store: ObjectStore, tag: str) -> None:
    """Remove a checkpoint: its part manifests first, then its manifest, then its objects,
    its claims last (in one call where the store deletes atomically). Missing is not an
    error."""
    base = f"{check_tag(tag)}/"
    if (await store.capabilities()).atomic_delete:  # all at once: no order to keep
        await store.delete(sorted({m.key for m in await store.list(base)}))
        return
    if parts := sorted(m.key for m in await store.list(base + PART_PREFIX)
                       if part_rank(m.key[len(base):]) is not None):
        await store.delete(parts)
    await store.delete([base + MANIFEST_NAME])
    keys = {m.key for m in await store.list(base)}
    claims = {k for k in keys if is_claim_file(k[len(base):]) or
              k[len(base):].startswith(CLAIMANTS.rstrip("/"))}
    await store.delete(sorted(keys - claims))
    await store.delete(sorted(claims - {base + CLAIM_NAME}))
    await store.delete([base + CLAIM_NAME])

"""The checkpoint as the store holds it: the check that every file is there, the manifest
written last (the commit), the committed manifests listed, and a checkpoint deleted.

A checkpoint exists only when ``<tag>/traind-manifest.json`` does. Before writing it the
store is listed under the tag, and every file of the manifest must be there with its size:
what a transfer tool reported (rsync exiting 0) is not proof; a temporary file a killed
writer left there is removed. Deleting removes the manifest
first, then the objects, the claims last, so no other writer takes the tag meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable

from traind.errors import MissingFilesError
from traind.layout.keys import AGREEMENT_DIR, CLAIM_NAME, MANIFEST_NAME, check_tag
from traind.layout.manifest import FileEntry, Manifest, listed
from traind.protocol.lease import check_committed, is_claim_file
from traind.protocol.listed import CLAIMANTS
from traind.storage.base import CREATE, OVERWRITE, ObjectStore
from traind.util.fileio import PART_SUFFIX
from traind.util.tasks import fan_out


async def read_manifest(store: ObjectStore, tag: str) -> Manifest | None:
    """The manifest of ``tag`` when it is committed: one small read."""
    found = await store.get(f"{check_tag(tag)}/{MANIFEST_NAME}")
    return None if found is None else Manifest.from_json(found.data)


async def verify_stored(store: ObjectStore, tag: str, files: Iterable[FileEntry]) -> set[str]:
    """Raise MissingFilesError unless every one of ``files`` is stored under ``tag`` with
    its size (one listing of the tag); return every name listed there."""
    base = f"{check_tag(tag)}/"
    stored = {m.key[len(base):]: m.size for m in await store.list(base)}
    if missing := [f.path for f in files if stored.get(f.path) != f.size]:
        raise MissingFilesError(tag, missing, store.where(base))
    return set(stored)


async def commit(store: ObjectStore, manifest: Manifest) -> None:
    """Check the files are stored, then write the manifest, never over one already there
    unless its writer is this manifest's (a retried commit): after this the checkpoint
    exists."""
    names = await verify_stored(store, manifest.tag, manifest.files)
    kept = {f.path for f in manifest.files}
    if strays := sorted(n for n in names if n.endswith(PART_SUFFIX) and n not in kept):
        # What a killed writer was writing (no other writes here now: the tag is this
        # writer's, or every part of it is stored).
        await store.delete([f"{manifest.tag}/{n}" for n in strays])
    key = f"{check_tag(manifest.tag)}/{MANIFEST_NAME}"
    body = manifest.to_json()
    if (await store.capabilities()).create and await store.put(key, body, CREATE):
        return
    check_committed(manifest.tag, manifest.writer, await read_manifest(store, manifest.tag),
                    store.where(key))
    await store.put(key, body, OVERWRITE)  # none there, or our own retried: these objects


async def manifests(store: ObjectStore, concurrency: int) -> list[Manifest]:
    """Every committed checkpoint of the run (a tag without a manifest is not one): one
    listing of the tags, then ``concurrency`` manifest reads at once."""
    tags = [t for t in await store.list_dirs() if t != AGREEMENT_DIR and _is_tag(t)]

    async def read(tag: str) -> Manifest | None:
        key = f"{tag}/{MANIFEST_NAME}"
        found = await store.get(key)
        return None if found is None else listed(found.data, store.where(key))

    return [m for m in await fan_out(tags, concurrency, read) if m is not None]


def _is_tag(name: str) -> bool:
    try:
        check_tag(name)
    except ValueError:
        return False  # not a directory of ours
    return True


async def delete(store: ObjectStore, tag: str) -> None:
    """Remove a checkpoint: manifest first, then its objects, its claims last (in one call
    where the store deletes atomically). Missing is not an error."""
    base = f"{check_tag(tag)}/"
    if (await store.capabilities()).atomic_delete:  # all at once: no order to keep
        await store.delete(sorted({m.key for m in await store.list(base)}))
        return
    await store.delete([base + MANIFEST_NAME])
    keys = {m.key for m in await store.list(base)}
    claims = {k for k in keys if is_claim_file(k[len(base):]) or
              k[len(base):].startswith(CLAIMANTS.rstrip("/"))}
    await store.delete(sorted(keys - claims))
    await store.delete(sorted(claims - {base + CLAIM_NAME}))
    await store.delete([base + CLAIM_NAME])

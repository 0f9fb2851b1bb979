"""One writer per tag: the claim taken before the first byte, kept as a lease while the
upload runs, released at a shutdown that could not commit, and taken over once stale.

The claim is ``<tag>/traind-writer.json`` holding a ``Lease``. It is made with the store's
create-only put where that is atomic, else by listing (``listing_claims.py``); it is renewed
with a replace-if-version put, which on a store with compare-and-swap fails when a taker got
in first. A takeover creates ``<tag>/traind-takeover-<nonce>.json`` so that one of several
takers goes on, then removes the stale writer's objects (and its unfinished uploads).
On a store that stages what it is sent (the Hub) there is no claim object: the change that
publishes a checkpoint's files with its manifest is create-only, so the first writer's
lands and the other's is refused (``commit.commit``).
"""

from __future__ import annotations

from traind.errors import StorageError, TransientStorageError
from traind.layout.keys import CLAIM_NAME, check_tag
from traind.layout.manifest import Writer
from traind.protocol import listing_claims as listed
from traind.protocol.commit import read_manifest
from traind.protocol.ownership import (
    ConflictError,
    Lease,
    check_committed,
    check_held,
    check_lease,
    is_claim_file,
)
from traind.protocol.parts import any_part_claim
from traind.storage.base import CREATE, ObjectStore, update


async def claim(store: ObjectStore, run: str, tag: str, writer: Writer) -> None:
    """Take ``tag`` of ``run`` for ``writer`` before any of its data goes out. Held or committed by
    ``writer`` already: nothing to do; another's uncommitted claim: ClaimHeldError; another's
    commit, or a multi-node job's tag: ConflictError."""
    base = f"{check_tag(tag)}/"
    if (await store.capabilities()).staged:  # the commit decides; only look who has it
        await _unclaimed(store, run, tag, writer)
        return
    key = base + CLAIM_NAME
    body = Lease.new(writer).to_json()
    if not await listed.create(store, key, body, base + listed.CLAIMANTS, tag, writer):
        found = await store.get(key)
        if found is None:  # taken over or pruned meanwhile: the next attempt finds it free
            raise TransientStorageError(f"{tag}: the claim {store.where(key)} vanished; "
                                        "retrying")
        check_lease(tag, writer, Lease.from_json(found.data),
                    await read_manifest(store, run, tag), store.where(key))
        return
    # The tag may be another's without a claim object of its own: a multi-node job's hosts
    # hold part claims (``claim_part`` looks for this claim after its own), and on a store
    # without compare-and-swap a stale writer's manifest (a retried put) may land after a
    # takeover removed its claim. Refused here, before any data of this writer goes out.
    try:
        await _unclaimed(store, run, tag, writer)
    except StorageError:
        await store.delete([key])
        raise


async def _unclaimed(store: ObjectStore, run: str, tag: str, writer: Writer) -> None:
    """Raise ConflictError when another writer committed ``tag``, or a multi-node job's
    host holds a part of it."""
    base = f"{check_tag(tag)}/"
    check_committed(tag, writer, await read_manifest(store, run, tag), store.where(base))
    if (holder := await any_part_claim(store, tag)) is not None:
        raise ConflictError(tag, str(writer), str(holder), store.where(base))


async def renew(store: ObjectStore, tag: str, writer: Writer, at: float | None = None) -> None:
    """Rewrite ``writer``'s claim renewed ``at`` (now by default), replace-if-version; raise
    ConflictError when the claim is not ``writer``'s any more (taken over, or removed)."""
    if (await store.capabilities()).staged:
        return  # no claim to renew (see claim)
    key = f"{check_tag(tag)}/{CLAIM_NAME}"
    found = await store.get(key)
    held = check_held(tag, writer, Lease.from_json(found.data) if found else None,
                      store.where(key))
    assert found is not None  # check_held passed
    if not await store.put(key, held.renewed(at).to_json(), update(found.version)):
        after = await store.get(key)
        check_held(tag, writer, Lease.from_json(after.data) if after else None,
                   store.where(key))
        raise TransientStorageError(f"{tag}: the claim {store.where(key)} changed while "
                                    "renewed; retrying")


async def release(store: ObjectStore, tag: str, writer: Writer) -> None:
    """Mark ``writer``'s claim on ``tag`` stale at once (a shutdown that could not commit
    it), so the next writer takes it over without waiting; another's is left alone."""
    found = await store.get(f"{check_tag(tag)}/{CLAIM_NAME}")
    if found is not None and Lease.from_json(found.data).writer.id == writer.id:
        await renew(store, tag, writer, 0.0)


async def take_over(store: ObjectStore, tag: str, stale: Lease, writer: Writer) -> bool:
    """Remove the stale claim ``stale`` on ``tag`` and every object of its uncommitted
    upload, for ``writer`` to claim next; False when another writer is taking it over or the
    claim was renewed. With compare-and-swap the claim becomes ``writer``'s own at once (the
    stale writer's next renewal fails); without, it is removed, and two takers at one instant
    may both go on, the claim after it then decided by the store's create (or listing)."""
    base = f"{check_tag(tag)}/"
    key = base + CLAIM_NAME
    caps = await store.capabilities()
    if not await store.put(base + stale.marker, writer.to_json(), CREATE):
        return False  # another writer is taking it over
    found = await store.get(key)
    if found is None or Lease.from_json(found.data) != stale or (caps.update and not (
            await store.put(key, Lease.new(writer).to_json(), update(found.version)))):
        await store.delete([base + stale.marker])  # renewed: its writer lives
        return False
    await store.abort_uploads(base)
    await store.delete(sorted(m.key for m in await store.list(base)
                              if not is_claim_file(m.key[len(base):])))
    if not caps.update:
        await store.delete([key])
    return True

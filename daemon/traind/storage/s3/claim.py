"""Taking a tag for one writer on S3: a conditional write, or a listing where there is none.

With conditional writes (``If-None-Match: *``; AWS S3 since 2024, SeaweedFS, MinIO, R2) the
claim object ``<tag>/traind-writer.json`` and the manifest are created only when absent, so
of two racing writers the store lets exactly one through. A store that ignores the header
(found once per backend with a probe object written twice, or ``TRAIND_S3_CONDITIONAL=0``)
gets a listing protocol instead, safe on a store with read-after-write consistency: every
writer puts its own ``<tag>/traind-claims/<id>.json`` and then lists them; alone, it has won
and writes the claim object; not alone, it withdraws and retries later, when it finds the
winner's claim object (a held claim, like any other) or the tag free again.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from traind.errors import StorageError, TransientStorageError
from traind.layout.keys import CLAIM_NAME
from traind.layout.manifest import Writer
from traind.storage.claim import Lease, check_held, check_lease, is_claim_file
from traind.storage.s3.client import Ops

log = structlog.get_logger("traind.s3")
CLAIMS_DIR = "traind-claims/"
CONDITIONAL = "conditional writes (If-None-Match: *): a tag is one writer's"
LISTED = ("claims listed after writing (the store ignores If-None-Match): a tag is one "
          "writer's on a store with read-after-write consistency")
_PRECONDITION = {"PreconditionFailed", "412"}
_OFF = {"0", "false", "no", "off"}
_UNSUPPORTED = {"NotImplemented", "501", "InvalidArgument", "InvalidRequest"}


async def put_new(ops: Ops, key: str, body: bytes, conditional: bool) -> bool:
    """Put ``body`` at ``key`` unless an object is there; return whether this put made it.
    Without ``conditional`` the caller already holds the tag and the put is plain."""
    params: dict[str, Any] = {"IfNoneMatch": "*"} if conditional else {}
    try:
        await ops.call("put_object", key, body=memoryview(body), ContentType="application/json",
                       **params)
    except StorageError as exc:
        if exc.code in _PRECONDITION:
            return False
        raise
    return True


async def get(ops: Ops, key: str) -> bytes | None:
    """The object at ``key``, or None when there is none."""
    found = await get_tagged(ops, key)
    return found[0] if found else None


async def get_tagged(ops: Ops, key: str) -> tuple[bytes, str] | None:
    """The object at ``key`` and its ETag, or None when there is none."""
    try:
        resp = await ops.call("get_object", key)
        async with resp["Body"] as body:
            data: bytes = await body.read()
    except StorageError as exc:
        if exc.missing:
            return None
        raise
    return data, str(resp.get("ETag", ""))


async def replace(ops: Ops, key: str, body: bytes, etag: str | None) -> bool:
    """Put ``body`` at ``key`` only if the object there still has ``etag`` (``If-Match``,
    a compare-and-swap); return whether it did. ``etag`` None: a plain put."""
    params: dict[str, Any] = {"IfMatch": etag} if etag else {}
    try:
        await ops.call("put_object", key, body=memoryview(body), ContentType="application/json",
                       **params)
    except StorageError as exc:
        if exc.code in _PRECONDITION or exc.missing:
            return False
        raise
    return True


async def honours_conditional(ops: Ops, prefix: str) -> bool:
    """Whether the store refuses a second ``If-None-Match: *`` put of one key (the probe
    object is removed again)."""
    if os.environ.get("TRAIND_S3_CONDITIONAL", "").strip().lower() in _OFF:
        return False
    key = f"{prefix}.traind-probe-claim-{uuid.uuid4().hex}"
    try:
        first = await put_new(ops, key, b"1", conditional=True)
        second = await put_new(ops, key, b"2", conditional=True)
    except StorageError as exc:  # a store that refuses the header outright
        if exc.code not in _UNSUPPORTED:
            raise
        first = second = True
    finally:
        await ops.call("delete_object", key)
    honoured = first and not second
    if not honoured:
        log.warning("s3_conditional_writes_ignored", prefix=prefix, claim=LISTED)
    return honoured


async def lease(ops: Ops, base: str) -> tuple[Lease, str] | None:
    """The claim on the tag under ``base`` and its ETag, or None when there is none."""
    found = await get_tagged(ops, base + CLAIM_NAME)
    return (Lease.from_json(found[0]), found[1]) if found is not None else None


async def claim(ops: Ops, base: str, tag: str, writer: Writer, conditional: bool,
                where: str) -> bool:
    """Take the tag whose objects live under ``base`` (``.../<tag>/``) for ``writer``;
    return True when this call took it, False when ``writer`` held it already. Raise
    ClaimHeldError when another writer holds it (the caller looks for its manifest)."""
    key = base + CLAIM_NAME
    body = Lease.new(writer).to_json()
    if conditional:
        if await put_new(ops, key, body, conditional=True):
            return True
    elif await get(ops, key) is None:
        await _claim_listed(ops, base, tag, writer, where)
        await put_new(ops, key, body, conditional=False)
        return True
    found = await lease(ops, base)
    if found is None:  # taken and pruned meanwhile: the next attempt finds it free
        raise TransientStorageError(f"{tag}: the claim in {where} vanished; retrying")
    check_lease(tag, writer, found[0], None, where)
    return False


async def renew(ops: Ops, base: str, tag: str, writer: Writer, at: float | None,
                conditional: bool, where: str) -> None:
    """Rewrite ``writer``'s claim renewed ``at``, with ``If-Match`` on its ETag where the
    store has conditional writes (a takeover in between makes it fail: the tag is lost);
    raise ConflictError when the claim is not ``writer``'s."""
    found = await lease(ops, base)
    held = check_held(tag, writer, found[0] if found else None, where)
    etag = found[1] if found and conditional else None
    if not await replace(ops, base + CLAIM_NAME, held.renewed(at).to_json(), etag):
        after = await lease(ops, base)
        check_held(tag, writer, after[0] if after else None, where)
        raise TransientStorageError(f"{tag}: the claim in {where} changed while renewed")


async def _claim_listed(ops: Ops, base: str, tag: str, writer: Writer, where: str) -> None:
    mine = f"{base}{CLAIMS_DIR}{writer.id}.json"
    await put_new(ops, mine, writer.to_json(), conditional=False)
    if not await _claimants(ops, base, writer):
        return
    # Withdraw and retry: the next attempt finds the winner's claim object (and waits on it
    # like any held claim), or the tag free again when every claimant withdrew.
    await ops.call("delete_object", mine)
    raise TransientStorageError(f"{tag}: two writers claimed it at once in {where}; retrying")


async def _claimants(ops: Ops, base: str, writer: Writer) -> list[Writer]:
    page = await ops.call("list_objects_v2", Prefix=base + CLAIMS_DIR, MaxKeys=100)
    others = []
    for obj in page.get("Contents", []):
        if not str(obj["Key"]).endswith(f"/{writer.id}.json"):
            data = await get(ops, str(obj["Key"]))
            if data is not None:
                others.append(Writer.from_json(data))
    return others


async def take_over(ops: Ops, base: str, stale: Lease, writer: Writer, conditional: bool,
                    delete_batch: Callable[[list[str]], Awaitable[None]]) -> bool:
    """Take the stale claim ``stale`` and remove every object of its writer under ``base``
    (multipart uploads under way too); return False when another writer takes it over or
    it was renewed. With conditional writes the claim is replaced by ``writer``'s own with
    ``If-Match`` (the stale writer's next renewal fails); without, two takers at one
    instant may both go on, and the claim after it is decided by the listing protocol."""
    if not await put_new(ops, base + stale.marker, writer.to_json(), conditional):
        return False
    found = await lease(ops, base)
    if found is None or found[0] != stale or (conditional and not await replace(
            ops, base + CLAIM_NAME, Lease.new(writer).to_json(), found[1])):
        await ops.call("delete_object", base + stale.marker)  # renewed: its writer lives
        return False
    markers: dict[str, Any] = {}
    while True:
        page = await ops.call("list_multipart_uploads", Prefix=base, **markers)
        for upload in page.get("Uploads", []):
            with contextlib.suppress(StorageError):  # finished or aborted meanwhile
                await ops.call("abort_multipart_upload", upload["Key"],
                               UploadId=upload["UploadId"])
        if not page.get("IsTruncated"):
            break
        markers = {"KeyMarker": page["NextKeyMarker"],
                   "UploadIdMarker": page["NextUploadIdMarker"]}
    while True:
        page = await ops.call("list_objects_v2", Prefix=base, MaxKeys=1000)
        keys = [k for obj in page.get("Contents", [])
                if not is_claim_file((k := str(obj["Key"]))[len(base):])]
        if not keys:
            break
        await delete_batch(keys)
    if not conditional:
        await ops.call("delete_object", base + CLAIM_NAME)
    return True

"""What a store holds is input, on every store (tests/conformance/conftest.py): a copy of a
checkpoint's directory, a manifest, part manifest or claim that lies or is malformed, and
start requests whose names are no rank, each put with the store's own ``put``, cost at most
the checkpoint they touch."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.conformance.conftest import Stores, claiming
from tests.conformance.test_multinode_parts import TAG as PART_TAG
from tests.conformance.test_multinode_parts import W0, part, send
from tests.conformance.test_protocol import A, _upload

from traind.errors import IntegrityError
from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME
from traind.layout.parts import part_name
from traind.protocol.resume import REQUEST

NESTED = b"[" * 100_000 + b"]" * 100_000
"""Deeper than any JSON parser recurses: a RecursionError where it is not caught."""


async def test_a_copy_of_a_checkpoint_is_no_checkpoint(stores: Stores, tmp_path: Path) -> None:
    """checkpoint-7's manifest and files copied under backup-<id> (``cp -r`` in the
    store), and a manifest of another run under its own tag: listed neither, each warned about
    once per path (not on every listing), and neither is committed as its tag."""
    store = stores.checkpoints()
    backup, theirs = f"backup-{uuid.uuid4().hex}", f"checkpoint-8-{uuid.uuid4().hex}"
    async with asyncio.timeout(90):
        ours = await _upload(store, tmp_path, {"w.bin": b"weights"}, A, "checkpoint-7")
        await store.commit(ours)
        for name, data in [("w.bin", b"weights"), (MANIFEST_NAME, ours.to_json())]:
            await store.objects.put(f"{backup}/{name}", data)
        other = json.loads(ours.to_json()) | {"run": "other", "tag": theirs}
        await store.objects.put(f"{theirs}/{MANIFEST_NAME}", json.dumps(other).encode())
        with capture_logs() as logs:
            assert await store.manifests() == [ours]
            assert await stores.checkpoints().manifests() == [ours]
            assert await store.committed(backup) is None
    warned = sorted(e["where"] for e in logs if e["event"] == "manifest_misplaced")
    assert warned == sorted(store.objects.where(f"{tag}/{MANIFEST_NAME}")
                            for tag in (backup, theirs))


async def test_malformed_manifests_cost_only_their_checkpoint(
    stores: Stores, tmp_path: Path
) -> None:
    """Manifests nested too deeply, listing no file or one file twice, with a NaN time, a
    step past 2**63 or naming no writer: the listing holds every other checkpoint and names
    each refused one."""
    store = stores.checkpoints()
    async with asyncio.timeout(90):
        ours = await _upload(store, tmp_path, {"w.bin": b"weights"}, A, "checkpoint-7")
        await store.commit(ours)
        good = json.loads(ours.to_json())
        lies = {
            "checkpoint-1": NESTED,
            "checkpoint-2": json.dumps(good | {"tag": "checkpoint-2", "files": [],
                                               "total_bytes": 0}).encode(),
            "checkpoint-3": json.dumps(good | {"tag": "checkpoint-3",
                                               "files": good["files"] * 2}).encode(),
            "checkpoint-4": json.dumps(good | {"tag": "checkpoint-4",
                                               "created_at": float("nan")}).encode(),
            "checkpoint-5": json.dumps(good | {"tag": "checkpoint-5", "step": 2**63}).encode(),
            "checkpoint-6": json.dumps({k: v for k, v in good.items() if k != "writer"}
                                       | {"tag": "checkpoint-6"}).encode(),
        }
        for tag, data in lies.items():
            await store.objects.put(f"{tag}/{MANIFEST_NAME}", data)
        listing = await store.listing()
    assert listing.manifests == [ours]
    assert sorted(u.where for u in listing.unreadable) == sorted(
        store.objects.where(f"{tag}/{MANIFEST_NAME}") for tag in lies)
    assert all(u.error.startswith("malformed manifest: ") for u in listing.unreadable)


async def test_part_manifests_of_another_place_or_malformed_are_ignored(
    stores: Stores, tmp_path: Path
) -> None:
    """A part manifest copied under another tag, and one nested too deeply: uncommitted()
    (what node 0 gives up on and deletes) holds only the real part, and parts() of those
    tags holds none."""
    host0 = stores.checkpoints()
    async with asyncio.timeout(90):
        files0 = {"__0_0.distcp": b"zero"}
        await host0.claim_part(PART_TAG, 0, W0)
        await send(host0, tmp_path, files0)
        await host0.commit_part(part0 := part(0, files0, W0))
        await host0.objects.put(f"checkpoint-9/{part_name(0)}", part0.to_json())
        await host0.objects.put(f"checkpoint-10/{part_name(1)}", NESTED)
        assert await host0.uncommitted() == {PART_TAG: [part0]}
        assert await host0.parts("checkpoint-9") == []
        assert await host0.parts("checkpoint-10") == []


@claiming
@pytest.mark.parametrize("claim", [
    NESTED,
    json.dumps({"id": A.id, "host": A.host, "nonce": "n", "renewed_at": float("nan")}).encode(),
    json.dumps({"id": ["x"], "host": "h"}).encode(),
    json.dumps({"id": A.id, "host": A.host, "renewed_at": 1.0}).encode(),
    json.dumps({"id": A.id, "host": A.host, "nonce": "n"}).encode(),
], ids=["nested", "nan-renewal", "id-not-a-string", "no-nonce", "no-renewal"])
async def test_a_malformed_claim_is_one_clear_error(stores: Stores, claim: bytes) -> None:
    """A claim object nested too deeply, renewed at NaN (a lease that would never go
    stale), naming no writer, or without its nonce or renewal time, is an IntegrityError
    naming it, for every writer."""
    store = stores.checkpoints()
    async with asyncio.timeout(60):
        await store.objects.put(f"checkpoint-7/{CLAIM_NAME}", claim)
        with pytest.raises(IntegrityError, match="malformed writer claim: "):
            await store.claim("checkpoint-7", A)


async def test_start_requests_named_with_no_rank_are_ignored(stores: Stores) -> None:
    """Objects in the agreement's directory whose rank is no ASCII number below 2**63
    (a superscript digit, twenty digits) are not start requests; the others still count."""
    store = stores.checkpoints()
    async with asyncio.timeout(60):
        await store.request_start(0, "a" * 32)
        for rank in ("\u00b2", "9" * 20):
            await store.objects.put(f"{REQUEST}{rank}-{'b' * 32}", b"")
        assert await store.start_requests() == {0: "a" * 32}

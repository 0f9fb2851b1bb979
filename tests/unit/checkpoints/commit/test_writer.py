"""The writer identity and the pure "whose tag is it" decisions."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from traind.checkpoints.commit.writer import WRITER_ID_FILE, load_or_create
from traind.errors import IntegrityError, TraindError
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol.ownership import (
    ClaimHeldError,
    ConflictError,
    Lease,
    check_claim,
    check_committed,
    check_held,
    check_lease,
)

A = Writer("a" * 32, "host-a")
B = Writer("b" * 32, "host-b")


def test_writer_id_is_made_once_per_state_dir(tmp_path: Path) -> None:
    """Every opener of one state_dir, racing or later, gets the same id and this host."""
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: load_or_create(tmp_path / "state"), range(16)))
    assert len(ids) == 1
    (only,) = ids
    assert only.host == socket.gethostname()
    assert load_or_create(tmp_path / "state") == only
    assert load_or_create(tmp_path / "other") != only
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [WRITER_ID_FILE]


def test_damaged_writer_id_is_a_clear_error(tmp_path: Path) -> None:
    """A writer-id file that holds no id is named in a one-line error."""
    (tmp_path / WRITER_ID_FILE).write_text("garbage")
    with pytest.raises(TraindError, match="writer-id: not a traind writer id"):
        load_or_create(tmp_path)


def test_manifest_records_its_writer_and_one_without_is_malformed() -> None:
    """The writer survives the JSON round trip; a stored manifest without one is malformed."""
    manifest = Manifest("run", "checkpoint-1", 1, (FileEntry("x", 1, "a" * 64),), writer=A)
    assert Manifest.from_json(manifest.to_json()).writer == A
    nameless = json.loads(manifest.to_json())
    del nameless["writer"]
    with pytest.raises(IntegrityError, match="malformed manifest: no 'writer'"):
        Manifest.from_json(json.dumps(nameless))


def test_claim_decisions() -> None:
    """Our own claim or manifest lets us go on; another writer's (or a made-up manifest
    naming none) is a conflict naming both writers."""
    check_claim("t", A, A, "here")
    check_committed("t", A, None, "here")
    check_committed("t", A, Manifest("run", "t", 1, (), writer=A), "here")
    with pytest.raises(ConflictError) as caught:
        check_claim("t", A, B, "here")
    assert (caught.value.tag, caught.value.ours, caught.value.theirs) == ("t", str(A), str(B))
    with pytest.raises(ConflictError) as caught:
        check_committed("t", A, Manifest("run", "t", 1, (), writer=B), "here")
    assert (caught.value.ours, caught.value.theirs) == (str(A), str(B))
    with pytest.raises(ConflictError):
        check_committed("t", A, Manifest("run", "t", 1, (), writer=None), "here")


def test_a_lease_is_stale_once_not_renewed_for_the_ttl() -> None:
    """A claim renewed less than claim_ttl ago is live; older, or released (0), is stale."""
    lease = Lease(A, "n1", renewed_at=1000.0)
    assert not lease.stale(60.0, now=1059.0)
    assert lease.stale(60.0, now=1061.0)
    assert lease.renewed(1100.0).nonce == "n1"
    assert not lease.renewed(1100.0).stale(60.0, now=1150.0)
    assert lease.renewed(0.0).stale(60.0, now=1001.0)
    assert Lease.from_json(lease.to_json()) == lease


def test_a_lease_renewed_further_ahead_than_the_ttl_is_stale() -> None:
    """A claim saying it was renewed more than claim_ttl in the future (no clock is off by
    that) would hold its tag for ever: it is stale; a little ahead (clock skew) is live."""
    assert Lease(A, "n1", renewed_at=1e15).stale(60.0, now=1000.0)
    assert not Lease(A, "n1", renewed_at=1030.0).stale(60.0, now=1000.0)


def test_a_claim_names_its_nonce_and_renewal() -> None:
    """A released claim reads back released (renewed at 0: stale at once); a claim naming
    no nonce or no renewal time (a bare writer) is malformed."""
    released = Lease.from_json(Lease.new(A).renewed(0.0).to_json())
    assert released.renewed_at == 0.0
    assert released.stale(600.0)
    with pytest.raises(IntegrityError, match="malformed writer claim: no 'nonce'"):
        Lease.from_json(A.to_json())


def test_another_writers_claim_is_held_until_committed() -> None:
    """Another writer's claim without a manifest is ClaimHeldError (wait), with one a
    ConflictError carrying the manifest; one's own claim passes; a lost one is a conflict."""
    theirs = Lease.new(B)
    with pytest.raises(ClaimHeldError) as held:
        check_lease("t", A, theirs, None, "here")
    assert held.value.lease == theirs
    assert held.value.theirs == str(B)
    committed = Manifest("run", "t", 1, (), writer=B)
    with pytest.raises(ConflictError) as conflict:
        check_lease("t", A, theirs, committed, "here")
    assert not isinstance(conflict.value, ClaimHeldError)
    assert conflict.value.committed == committed
    check_lease("t", B, theirs, None, "here")
    assert check_held("t", B, theirs, "here") == theirs
    for found in (theirs, None):
        with pytest.raises(ConflictError):
            check_held("t", A, found, "here")

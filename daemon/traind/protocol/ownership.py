"""The one decision every claim and commit makes: whose tag is it?

Pure: the protocol reads what the store holds (a claim, a manifest) and asks here whether
this writer may go on; ``ConflictError`` carries both writers for the log and the CLI.
A claim is a lease: its holder renews it while it uploads, and one not renewed for
``claim_ttl`` without a manifest is stale (its writer died mid-upload), so another writer
may take it over instead of waiting forever.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, replace

from traind.errors import StorageError
from traind.layout.fields import read, real, text
from traind.layout.keys import CLAIM_NAME
from traind.layout.manifest import Manifest, Writer


class ConflictError(StorageError):
    """Another writer holds this checkpoint in the store; ours is not stored there."""

    def __init__(self, tag: str, ours: str, theirs: str, where: str = "") -> None:
        self.tag = tag
        self.ours = ours
        self.theirs = theirs
        self.committed: Manifest | None = None
        """The other writer's manifest of the tag, when it is committed."""
        at = f" in {where}" if where else ""
        super().__init__(
            f"{tag}{at} belongs to writer {theirs}, not to this one ({ours}): another traind "
            "with the same run.name writes to this store; the local copy is kept"
        )


class ClaimHeldError(ConflictError):
    """Another writer's claim holds this checkpoint and it is not committed: wait until it
    commits (a conflict then) or its claim goes stale (taken over then)."""

    def __init__(self, tag: str, ours: str, lease: Lease, where: str = "") -> None:
        super().__init__(tag, ours, str(lease.writer), where)
        self.lease = lease
        at = f" in {where}" if where else ""
        renewed = f"renewed {lease.age():.0f}s ago" if lease.renewed_at else "released"
        self.args = (
            f"{tag}{at} belongs to writer {lease.writer}, not to this one ({ours}): its "
            f"upload is not committed (claim {renewed}); this one is stored once that "
            "writer commits (a conflict then) or stops renewing its claim for "
            "storage.claim_ttl (taken over then)",
        )


def check_claim(tag: str, ours: Writer, holder: Writer, where: str) -> None:
    """Raise ConflictError unless the claim on ``tag`` is ``ours`` (a restart, a retry)."""
    if holder.id != ours.id:
        raise ConflictError(tag, str(ours), str(holder), where)


def check_committed(tag: str, ours: Writer, found: Manifest | None, where: str) -> None:
    """Raise ConflictError when ``tag`` is committed already (``found``, a stored manifest,
    which names its writer) by another writer."""
    if found is None:
        return
    if found.writer is None or found.writer.id != ours.id:
        conflict = ConflictError(tag, str(ours), str(found.writer), where)
        conflict.committed = found
        raise conflict


TAKEOVER_PREFIX = "traind-takeover-"
"""Beside the claim: ``traind-takeover-<nonce>.json``, created atomically by the one writer
that takes over the stale claim with that nonce (kept until the tag is deleted)."""


@dataclass(frozen=True)
class Lease:
    """A claim as stored: its writer, a nonce naming this taking of the tag, and when the
    holder last renewed it (0: released)."""

    writer: Writer
    nonce: str
    renewed_at: float

    @classmethod
    def new(cls, writer: Writer) -> Lease:
        """A fresh claim of ``writer``, renewed now."""
        return cls(writer, secrets.token_hex(8), time.time())

    def renewed(self, at: float | None = None) -> Lease:
        """The same claim renewed at ``at`` (now by default)."""
        return replace(self, renewed_at=time.time() if at is None else at)

    def age(self, now: float | None = None) -> float:
        """Seconds since the last renewal."""
        return max(0.0, (time.time() if now is None else now) - self.renewed_at)

    def stale(self, ttl: float, now: float | None = None) -> bool:
        """Whether the holder stopped renewing for longer than ``ttl``: it died or let go;
        or the claim says it was renewed more than ``ttl`` ahead of now, which no clock
        is off by (a lie that would hold the tag for ever)."""
        now = time.time() if now is None else now
        return self.age(now) > ttl or self.renewed_at - now > ttl

    @property
    def marker(self) -> str:
        """The name whose atomic create decides who takes this claim over."""
        return f"{TAKEOVER_PREFIX}{self.nonce}.json"

    def to_json(self) -> bytes:
        """The claim object's body in the store: the writer, nonce and last renewal."""
        body = {"id": self.writer.id, "host": self.writer.host, "nonce": self.nonce,
                "renewed_at": self.renewed_at}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Lease:
        """Parse a claim object, which names its writer, nonce and last renewal; raise
        IntegrityError if malformed."""
        return read(data, "writer claim", lambda raw: cls(
            Writer.of(raw), text(raw, "nonce"), real(raw, "renewed_at")))


def is_claim_file(name: str) -> bool:
    """Whether ``name`` (in a tag's directory) is the claim or a takeover marker, which a
    takeover keeps while it removes the stale writer's objects."""
    return name == CLAIM_NAME or (name.startswith(TAKEOVER_PREFIX) and "/" not in name)


def check_lease(tag: str, ours: Writer, found: Lease, committed: Manifest | None,
                where: str) -> None:
    """Raise unless ``found`` (the claim on ``tag``) is ``ours``: ClaimHeldError while the
    other writer's upload is uncommitted (``committed`` None), else ConflictError."""
    if found.writer.id == ours.id:
        return
    if committed is None:
        raise ClaimHeldError(tag, str(ours), found, where)
    conflict = ConflictError(tag, str(ours), str(found.writer), where)
    conflict.committed = committed
    raise conflict


def check_held(tag: str, ours: Writer, found: Lease | None, where: str) -> Lease:
    """Return ``found`` if it is still ``ours`` (a renewal, the check before the manifest);
    raise ConflictError when this writer lost the tag (taken over, or removed)."""
    if found is not None and found.writer.id == ours.id:
        return found
    theirs = str(found.writer) if found else "nobody (the claim was removed)"
    raise ConflictError(tag, str(ours), theirs, where)

"""The life cycle of one checkpoint in the streamer, as a table: pure, tested without I/O.

    staged ──complete──▶ ready ──claimed──▶ uploading ──verified at the store──▶ committed
                          │  ▲                  │
                          │  └── retried ◀──────┤ store down, files missing, claim held,
                          │                     │ other hosts' parts still coming
                          ▼                     ▼
                      dropped               conflict (another writer's tag, or the parts
               (let go: disk full,           disagree) · rewritten (snapshot again) ·
                coalesced)                   pruned while waiting (a part, gone)

One attempt to commit a checkpoint ends in a ``Step``: committed, or what the exception it
raised means for the checkpoint. ``step_after`` reads it off ``STEPS``, first match first (a
subclass before its base); the streamer has one handler per step.
"""

from __future__ import annotations

from enum import Enum

from traind.checkpoints.intake.snapshot import RewrittenError
from traind.errors import MissingFilesError, StorageError, TraindError
from traind.layout.parts import Incomplete, PartsDisagreeError
from traind.protocol.ownership import ClaimHeldError, ConflictError


class Step(Enum):
    """What happens to a checkpoint after one attempt to commit it."""

    COMMITTED = "committed"
    """Stored: journalled, its snapshot let go."""
    STOPPED = "stopped"
    """Its upload was cancelled (let go, or set aside while the disk is full)."""
    REWRITTEN = "rewritten"
    """The trainer wrote over it after it was complete: snapshot again once complete."""
    CLAIM_HELD = "claim_held"
    """Another writer's uncommitted claim holds it: try again, no later than that goes stale."""
    PARTS_PENDING = "parts_pending"
    """This host's part is stored; look again for the other hosts' parts."""
    PARTS_GONE = "parts_gone"
    """This host's part is gone from the store (committed and pruned, or given up)."""
    PARTS_DISAGREE = "parts_disagree"
    """The hosts' parts cannot be one checkpoint: never committed, the local copy kept."""
    FILES_MISSING = "files_missing"
    """The store lacks files the upload reported stored: send them again."""
    CONFLICT = "conflict"
    """Another writer's tag: never stored here, the local copy kept."""
    FAILED = "failed"
    """The store or the disk failed: try again with backoff."""


class DroppedError(TraindError):
    """The checkpoint in flight was let go (``Streamer.drop``) before it was committed."""


class PartsGoneError(TraindError):
    """This host's part of a checkpoint is gone from the store (committed, then pruned)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(f"{tag}: this host's part is no longer in the store")


class PartsPendingError(TraindError):
    """This host's part is stored; other hosts' parts are still missing."""

    def __init__(self, tag: str, state: Incomplete) -> None:
        self.tag = tag
        self.state = state
        super().__init__(f"{tag}: waiting for the parts of nodes "
                         f"{', '.join(map(str, state.missing))}")


STEPS: tuple[tuple[type[BaseException], Step], ...] = (
    (DroppedError, Step.STOPPED),
    (RewrittenError, Step.REWRITTEN),
    (ClaimHeldError, Step.CLAIM_HELD),  # a ConflictError, not final yet
    (PartsPendingError, Step.PARTS_PENDING),
    (PartsGoneError, Step.PARTS_GONE),
    (PartsDisagreeError, Step.PARTS_DISAGREE),
    (MissingFilesError, Step.FILES_MISSING),  # a StorageError, answered at once
    (ConflictError, Step.CONFLICT),
    (StorageError, Step.FAILED),
    (OSError, Step.FAILED),
)
"""An attempt's exception → the step it leads to; the first matching type decides."""

def step_after(exc: BaseException | None) -> Step | None:
    """The step an attempt that raised ``exc`` (None: it committed) leads to; None for an
    exception that is no step of a checkpoint's (a bug: raised on)."""
    if exc is None:
        return Step.COMMITTED
    return next((step for kind, step in STEPS if isinstance(exc, kind)), None)

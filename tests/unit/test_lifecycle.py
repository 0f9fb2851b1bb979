"""The streamer's table of what follows an attempt to commit a checkpoint: a subclass is
read before its base, and an exception that is no step of a checkpoint's is raised on."""

from __future__ import annotations

import pytest
from traind.checkpoints.commit.lifecycle import (
    DroppedError,
    PartsGoneError,
    PartsPendingError,
    Step,
    step_after,
)
from traind.checkpoints.intake.snapshot import RewrittenError
from traind.protocol.ownership import ClaimHeldError, ConflictError, Lease

from traind.errors import MissingFilesError, StorageError, TransientStorageError
from traind.layout.manifest import Writer
from traind.layout.parts import Incomplete, PartsDisagreeError

A, B = Writer("a" * 32, "host-a"), Writer("b" * 32, "host-b")


@pytest.mark.parametrize(("raised", "step"), [
    (None, Step.COMMITTED),
    (DroppedError("let go"), Step.STOPPED),
    (RewrittenError("checkpoint-1", ["model.bin"]), Step.REWRITTEN),
    (ClaimHeldError("checkpoint-1", str(A), Lease.new(B)), Step.CLAIM_HELD),
    (ConflictError("checkpoint-1", str(A), str(B)), Step.CONFLICT),
    (PartsPendingError("checkpoint-1", Incomplete((0,), (1,))), Step.PARTS_PENDING),
    (PartsGoneError("checkpoint-1"), Step.PARTS_GONE),
    (PartsDisagreeError("checkpoint-1: differs"), Step.PARTS_DISAGREE),
    (MissingFilesError("checkpoint-1", ["model.bin"]), Step.FILES_MISSING),
    (TransientStorageError("down"), Step.FAILED),
    (StorageError("refused"), Step.FAILED),
    (OSError(28, "No space left on device"), Step.FAILED),
])
def test_each_end_of_an_attempt_is_one_step(raised: BaseException | None, step: Step) -> None:
    assert step_after(raised) is step


def test_a_bug_is_no_step() -> None:
    """An exception the table does not name (a bug) is raised on, not retried forever."""
    assert step_after(KeyError("x")) is None

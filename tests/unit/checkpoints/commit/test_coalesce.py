"""Coalescing on a store that limits commits: the newest and the pinned are never skipped."""

from __future__ import annotations

import pytest

from traind.checkpoints.commit.coalesce import newer_tag, pinned, superseded_by


@pytest.mark.parametrize(("step", "waiting", "every", "expected"), [
    (10, [], 0, None),              # alone: committed
    (10, [5], 0, None),             # the newest: committed
    (10, [20, 30], 0, 30),          # older than the newest waiting: skipped for it
    (10, [20, 30], 10, None),       # pinned by keep_every_steps: committed
    (15, [20, 30], 10, 30),         # not a multiple: skipped
    (30, [10, 20, 30], 0, None),    # the same step again is not newer
])
def test_only_unpinned_older_checkpoints_are_superseded(
        step: int, waiting: list[int], every: int, expected: int | None) -> None:
    """An older checkpoint waits for nothing when a newer one waits too, unless pinned."""
    assert superseded_by(step, waiting, every) == expected


def test_pinned_is_a_multiple_of_keep_every_steps() -> None:
    """Nothing is pinned without keep_every_steps; with it, exactly its multiples."""
    assert not pinned(1000, 0)
    assert pinned(1000, 500)
    assert not pinned(1001, 500)


def test_newer_tag_names_the_waiting_checkpoint_that_supersedes() -> None:
    """By tag: the newest other waiting tag, none for the newest itself or an unnumbered tag."""
    waiting = ["checkpoint-10", "checkpoint-20", "checkpoint-30", "final"]
    assert newer_tag("checkpoint-10", waiting, 0) == "checkpoint-30"
    assert newer_tag("checkpoint-30", waiting, 0) is None
    assert newer_tag("checkpoint-20", waiting, 10) is None
    assert newer_tag("final", waiting, 0) is None

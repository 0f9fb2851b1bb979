"""The completion rule: snapshot as soon as a marker exists, complete once settled."""

from __future__ import annotations

from traind.checkpoints.completion import Action, Observation, Tracked, decide

A = frozenset({("model.bin", 10, 1), ("trainer_state.json", 2, 1)})
B = frozenset({("model.bin", 20, 2), ("trainer_state.json", 2, 1)})


def seen(
    sig: frozenset[tuple[str, int, int]] = A, marker: bool = True, explicit: bool = False
) -> Observation:
    return Observation(sig, marker, explicit)


def test_no_marker_waits() -> None:
    """A directory without a marker is still being written."""
    assert decide(None, seen(marker=False), 100.0, 5.0) is Action.WAIT


def test_marker_stages_at_once() -> None:
    """The first sight of a marker snapshots immediately, before any settle time."""
    assert decide(None, seen(), 100.0, 5.0) is Action.STAGE


def test_change_restages() -> None:
    """A change after the snapshot takes a new snapshot."""
    assert decide(Tracked(A, 100.0), seen(B), 200.0, 5.0) is Action.STAGE


def test_settled_completes() -> None:
    """Unchanged for the settle period means complete."""
    assert decide(Tracked(A, 100.0), seen(), 104.9, 5.0) is Action.WAIT
    assert decide(Tracked(A, 100.0), seen(), 105.0, 5.0) is Action.COMPLETE


def test_explicit_marker_skips_settle() -> None:
    """traind's own marker completes without waiting."""
    assert decide(Tracked(A, 100.0), seen(explicit=True), 100.1, 5.0) is Action.COMPLETE


def test_vanished_after_snapshot_completes() -> None:
    """A trainer rotates only finished checkpoints: gone after a snapshot is complete."""
    assert decide(Tracked(A, 100.0), None, 100.1, 5.0) is Action.COMPLETE


def test_vanished_before_snapshot_is_ignored() -> None:
    """A directory that vanished before any marker is nothing to store."""
    assert decide(None, None, 100.0, 5.0) is Action.IGNORE


def test_marker_removed_while_tracked_waits() -> None:
    """A marker that disappears means the trainer is rewriting: wait."""
    assert decide(Tracked(A, 100.0), seen(marker=False), 200.0, 5.0) is Action.WAIT


def test_mtime_order_is_irrelevant() -> None:
    """An older mtime is a change like any other; nothing is ordered by mtime."""
    older = frozenset({("model.bin", 10, 0), ("trainer_state.json", 2, 1)})
    assert decide(Tracked(A, 100.0), seen(older), 200.0, 5.0) is Action.STAGE

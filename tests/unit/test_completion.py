"""The completion rule: snapshot as soon as a marker exists, complete once settled."""

from __future__ import annotations

from pathlib import Path

from traind.checkpoints.intake.completion import (
    Observation,
    ScanAction,
    Tracked,
    decide,
    decide_at_stop,
    settles_in,
    unmarked_settles,
)
from traind.checkpoints.intake.watcher import listing, tag_problem

A = frozenset({("model.bin", 10, 1), ("trainer_state.json", 2, 1)})
B = frozenset({("model.bin", 20, 2), ("trainer_state.json", 2, 1)})


def seen(
    sig: frozenset[tuple[str, int, int]] = A, marker: bool = True, explicit: bool = False
) -> Observation:
    return Observation(sig, marker, explicit)


def test_no_marker_waits() -> None:
    """A directory without a marker is still being written."""
    assert decide(None, seen(marker=False), 100.0, 5.0) is ScanAction.WAIT


def test_marker_stages_at_once() -> None:
    """The first sight of a marker snapshots immediately, before any settle time."""
    assert decide(None, seen(), 100.0, 5.0) is ScanAction.STAGE


def test_change_restages() -> None:
    """A change after the snapshot takes a new snapshot."""
    assert decide(Tracked(A, 100.0), seen(B), 200.0, 5.0) is ScanAction.STAGE


def test_only_hosts_past_node_0_of_a_multi_node_job_settle_unmarked_directories() -> None:
    """Node 0 (the coordinator's markers are on its disk) and a single host wait for a
    marker; every other host of a multi-node job does without."""
    assert [unmarked_settles(r, 3) for r in range(3)] == [False, True, True]
    assert not unmarked_settles(0, 1)


def test_an_unmarked_directory_with_files_settles_on_a_host_past_node_0() -> None:
    """Node 1 of a DCP job holds only __1_0.distcp: its directory is staged at once,
    restaged on change, and complete once quiet for settle, without any marker."""
    part = frozenset({("__1_0.distcp", 10, 1)})
    bigger = frozenset({("__1_0.distcp", 20, 2)})
    assert decide(None, seen(part, marker=False), 100.0, 5.0, True) is ScanAction.STAGE
    assert decide(Tracked(part, 100.0), seen(bigger, marker=False), 101.0, 5.0,
                  True) is ScanAction.STAGE
    assert decide(Tracked(bigger, 101.0), seen(bigger, marker=False), 105.9, 5.0,
                  True) is ScanAction.WAIT
    assert decide(Tracked(bigger, 101.0), seen(bigger, marker=False), 106.0, 5.0,
                  True) is ScanAction.COMPLETE


def test_an_empty_unmarked_directory_waits_even_where_unmarked_ones_settle() -> None:
    """A directory the trainer has just created holds no file yet: nothing to stage (an
    empty snapshot would give the checkpoint up)."""
    assert decide(None, seen(frozenset(), marker=False), 100.0, 5.0, True) is ScanAction.WAIT


def test_the_explicit_marker_completes_a_part_at_once_on_every_host() -> None:
    """TraindCallback's marker, written on every node, skips the settle wait there too."""
    part = frozenset({("rng_state_1.pth", 10, 1)})
    assert decide(Tracked(part, 100.0), seen(part, marker=False, explicit=True), 100.1, 5.0,
                  True) is ScanAction.COMPLETE


def test_settled_completes() -> None:
    """Unchanged for the settle period means complete."""
    assert decide(Tracked(A, 100.0), seen(), 104.9, 5.0) is ScanAction.WAIT
    assert decide(Tracked(A, 100.0), seen(), 105.0, 5.0) is ScanAction.COMPLETE


def test_explicit_marker_skips_settle() -> None:
    """traind's own marker completes without waiting."""
    assert decide(Tracked(A, 100.0), seen(explicit=True), 100.1, 5.0) is ScanAction.COMPLETE


def test_vanished_after_snapshot_completes() -> None:
    """A trainer rotates only finished checkpoints: gone after a snapshot is complete."""
    assert decide(Tracked(A, 100.0), None, 100.1, 5.0) is ScanAction.COMPLETE


def test_vanished_before_snapshot_is_ignored() -> None:
    """A directory that vanished before any marker is nothing to store."""
    assert decide(None, None, 100.0, 5.0) is ScanAction.IGNORE


def test_marker_removed_while_tracked_waits() -> None:
    """A marker that disappears means the trainer is rewriting: wait."""
    assert decide(Tracked(A, 100.0), seen(marker=False), 200.0, 5.0) is ScanAction.WAIT


def test_mtime_order_is_irrelevant() -> None:
    """An older mtime is a change like any other; nothing is ordered by mtime."""
    older = frozenset({("model.bin", 10, 0), ("trainer_state.json", 2, 1)})
    assert decide(Tracked(A, 100.0), seen(older), 200.0, 5.0) is ScanAction.STAGE


def test_at_stop_an_unsettled_snapshot_is_complete_once_the_writer_is_gone() -> None:
    """With the trainer stopped, a marked directory snapshot a moment ago is complete."""
    assert decide_at_stop(Tracked(A, 100.0), seen(), writer_gone=True) is ScanAction.COMPLETE


def test_at_stop_an_unseen_or_changed_directory_is_snapshot_first() -> None:
    """A marked directory not snapshot yet (or changed since) is snapshot, then complete."""
    assert decide_at_stop(None, seen(), writer_gone=True) is ScanAction.STAGE
    assert decide_at_stop(Tracked(A, 100.0), seen(B), writer_gone=True) is ScanAction.STAGE


def test_at_stop_a_directory_without_marker_is_not_complete() -> None:
    """A save cut short by the stop (no marker) is never taken for a checkpoint."""
    assert decide_at_stop(None, seen(marker=False), writer_gone=True) is ScanAction.IGNORE
    assert decide_at_stop(Tracked(A, 1.0), seen(marker=False), writer_gone=True) is ScanAction.IGNORE


def test_at_stop_with_a_writer_of_its_own_only_the_explicit_marker_counts() -> None:
    """Without a supervised trainer the writer may still be saving: only traind's explicit
    marker makes a directory complete."""
    assert decide_at_stop(Tracked(A, 100.0), seen(), writer_gone=False) is ScanAction.IGNORE
    assert decide_at_stop(None, seen(explicit=True), writer_gone=False) is ScanAction.STAGE
    explicit = seen(explicit=True)
    assert decide_at_stop(Tracked(A, 1.0), explicit, writer_gone=False) is ScanAction.COMPLETE


def test_settles_in_counts_down_from_the_snapshot_and_never_below_zero() -> None:
    """A candidate unchanged since its snapshot settles ``settle`` s after it; one already
    settled (or with no settle at all) needs no wait."""
    assert settles_in(Tracked(A, 100.0), 100.0, 5.0) == 5.0
    assert settles_in(Tracked(A, 100.0), 103.5, 5.0) == 1.5
    assert settles_in(Tracked(A, 100.0), 105.0, 5.0) == 0.0
    assert settles_in(Tracked(A, 100.0), 400.0, 5.0) == 0.0
    assert settles_in(Tracked(A, 100.0), 100.0, 0.0) == 0.0


def test_at_stop_a_vanished_snapshot_is_complete() -> None:
    """Rotated away after its snapshot: complete, as at any other time."""
    assert decide_at_stop(Tracked(A, 100.0), None, writer_gone=True) is ScanAction.COMPLETE
    assert decide_at_stop(None, None, writer_gone=True) is ScanAction.IGNORE


def test_directory_names_that_are_no_tag_are_set_apart(tmp_path: Path) -> None:
    """Matching directories are checkpoints only with a valid tag ending in a step; the
    others are named with the reason (so the watcher can warn once and skip them)."""
    for name in ["checkpoint-1", "checkpoint-201 copy 2", "checkpoint-ü-201", "checkpoint-x",
                 "other-3"]:
        (tmp_path / name).mkdir()
    found, odd = listing(tmp_path, "checkpoint-*")
    assert found == {"checkpoint-1": 1}
    assert sorted(odd) == ["checkpoint-201 copy 2", "checkpoint-x", "checkpoint-ü-201"]
    assert odd["checkpoint-x"] == "no step number at the end of 'checkpoint-x'"
    assert odd["checkpoint-201 copy 2"].startswith("unsafe tag")
    assert tag_problem("checkpoint-7") is None


def test_at_stop_an_unmarked_host_takes_a_directory_holding_files() -> None:
    """Past node 0 (``unmarked_settles``) the last scan after the writer is gone hands on a
    directory by its files alone, as the running scans do after settle; an empty one, or
    one while the writer may still be saving, is not."""
    assert decide_at_stop(None, seen(marker=False), True, unmarked_settles=True) is ScanAction.STAGE
    assert decide_at_stop(Tracked(A, 1.0), seen(marker=False), True,
                          unmarked_settles=True) is ScanAction.COMPLETE
    assert decide_at_stop(None, seen(marker=False), False,
                          unmarked_settles=True) is ScanAction.IGNORE
    assert decide_at_stop(None, seen(marker=False), True) is ScanAction.IGNORE

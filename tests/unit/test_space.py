"""Which pinned snapshots to let go when free space falls below the floor: exhaustive checks
of the invariants over every small shape, plus the floor itself."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from traind.checkpoints.state.space import (
    Pinned,
    floor_bytes,
    retention_seen,
    rotated_next,
    to_drop,
)

from traind.util.units import parse_floor


def pin(step: int, unique: int = 100, exists: bool = False, rotating: bool = False) -> Pinned:
    return Pinned(f"checkpoint-{step}", step, 100, unique, exists, rotating)


def tags(dropped: list[Pinned]) -> list[str]:
    return [p.tag for p in dropped]


def test_oldest_rotated_away_go_first() -> None:
    """Below the floor the oldest rotated-away snapshots go, just enough to reach it."""
    pinned = [pin(3), pin(1), pin(2), pin(4)]
    assert tags(to_drop(free=50, floor=200, pinned=pinned)) == ["checkpoint-1", "checkpoint-2"]


def test_nothing_dropped_at_or_above_the_floor() -> None:
    """With free space at the floor, nothing is dropped."""
    assert to_drop(free=200, floor=200, pinned=[pin(1), pin(2)]) == []


def test_the_newest_is_kept_even_when_short() -> None:
    """The newest snapshot stays although dropping it would be the only way to the floor."""
    assert tags(to_drop(free=0, floor=10_000, pinned=[pin(1), pin(2)])) == ["checkpoint-1"]
    assert to_drop(free=0, floor=10_000, pinned=[pin(7)]) == []


def test_ones_the_trainer_still_has_are_kept() -> None:
    """A snapshot whose source still exists (or holding no bytes of its own) frees nothing,
    so it is kept and an older or newer one that does free space goes instead."""
    pinned = [pin(1, exists=True), pin(2, unique=0), pin(3), pin(4)]
    assert tags(to_drop(free=0, floor=50, pinned=pinned)) == ["checkpoint-3"]


def test_one_the_trainer_rotates_before_its_next_save_goes_before_that_save() -> None:
    """A snapshot whose source the trainer is about to delete counts for its whole size:
    let go now, the room is there when the trainer's next save begins."""
    pinned = [pin(1, unique=0, exists=True, rotating=True), pin(2, unique=0, exists=True),
              pin(3, unique=0, exists=True)]
    assert tags(to_drop(free=20, floor=100, pinned=pinned)) == ["checkpoint-1"]
    assert to_drop(free=20, floor=100, pinned=[replace(p, rotating=False) for p in pinned]) == []


def test_the_one_in_flight_goes_last() -> None:
    """The snapshot being uploaded is let go only when the others do not reach the floor."""
    flying = replace(pin(1), in_flight=True)
    assert tags(to_drop(free=0, floor=100, pinned=[flying, pin(2), pin(3)])) == ["checkpoint-2"]
    assert tags(to_drop(free=0, floor=200, pinned=[flying, pin(2), pin(3)])) == [
        "checkpoint-2", "checkpoint-1"]


def test_rotated_next_is_all_but_the_trainers_newest_it_keeps() -> None:
    """With retention known, every checkpoint beyond it goes; unknown, none (the trainer may
    keep them all); never any when the trainer holds no more than it keeps."""
    assert rotated_next([3, 1, 2], 2) == {1}
    assert rotated_next([4, 5], 2) == set()
    assert rotated_next([1, 2, 3, 4], 1) == {1, 2, 3}
    assert rotated_next([], 2) == set()
    assert rotated_next([7, 5, 6], None) == set()


def test_retention_is_the_fewest_checkpoints_seen_after_a_rotation() -> None:
    """Learnt only once the trainer rotated one away, then never grows; an empty output_dir
    teaches nothing."""
    assert retention_seen(None, 3, rotated=False) is None
    assert retention_seen(None, 3, rotated=True) == 3
    assert retention_seen(3, 2, rotated=True) == 2
    assert retention_seen(2, 3, rotated=True) == 2
    assert retention_seen(2, 0, rotated=True) == 2
    assert retention_seen(2, 1, rotated=False) == 2


def _shapes() -> list[tuple[int, int, list[Pinned]]]:
    """Every history of up to 4 snapshots, each kind, under a range of free/floor."""
    kinds = [(0, False, False), (60, False, False), (150, False, False), (60, True, False),
             (0, True, True)]
    shapes = []
    for n in range(5):
        for combo in itertools.product(kinds, repeat=n):
            pinned = [pin(i + 1, unique, exists, rotating)
                      for i, (unique, exists, rotating) in enumerate(combo)]
            for free, floor in itertools.product((0, 100, 250), (0, 100, 300, 1000)):
                shapes.append((free, floor, pinned))
    return shapes


def test_invariants() -> None:
    """Never the newest, never one the trainer keeps, oldest first, and no more than
    needed: without the last one dropped, free space would still be below the floor; and
    when it stays below, every snapshot that could go has gone."""
    shapes = _shapes()
    assert len(shapes) > 4000
    for free, floor, pinned in shapes:
        _check(free, floor, pinned)


def _check(free: int, floor: int, pinned: list[Pinned]) -> None:
    dropped = to_drop(free, floor, list(reversed(pinned)))  # order of the input is no hint
    eligible = [p for p in pinned[:-1]
                if (not p.source_exists and p.unique_bytes > 0) or (p.source_exists and p.rotating)]
    assert dropped == eligible[: len(dropped)]
    if pinned:
        assert pinned[-1] not in dropped
    after = free + sum(p.frees for p in dropped)
    if dropped:
        assert after - dropped[-1].frees < floor
    if after < floor:
        assert dropped == eligible
    if free >= floor:
        assert dropped == []


@pytest.mark.parametrize(
    ("text", "floor"),
    [("1.5x", (1.5, 0)), (" 2 X", (2.0, 0)), ("0x", (0.0, 0)), ("20GiB", (0.0, 20 * 1024**3)),
     (0, (0.0, 0)), ("512k", (0.0, 512_000))],
)
def test_parse_floor(text: object, floor: tuple[float, int]) -> None:
    """A floor is a multiple of the checkpoint size or a size; 0 switches it off."""
    assert parse_floor(text) == floor


@pytest.mark.parametrize("text", ["x", "-1x", "nanx", "infx", "big", "-5"])
def test_parse_floor_rejects(text: str) -> None:
    """Anything else is refused with a message naming the value."""
    with pytest.raises(ValueError, match=r"is not a size|multiple of the checkpoint size"):
        parse_floor(text)


def test_floor_bytes() -> None:
    """A multiple scales with the checkpoint's size; a fixed size does not."""
    assert floor_bytes(1.5, 0, 1000) == 1500
    assert floor_bytes(0.0, 4096, 1000) == 4096
    assert floor_bytes(1.5, 0, 0) == 0

"""The journal's reserve: how big it is, when it may be taken, and that it comes and goes."""

from __future__ import annotations

from pathlib import Path

from traind.checkpoints.state.reserve import (
    RESERVE_BYTES,
    ROOM_FACTOR,
    Reserve,
    reserve_size,
    worth_arming,
)

MIB = 1024 * 1024


def test_reserve_size_is_capped_and_a_small_share_of_a_small_disk() -> None:
    """At most RESERVE_BYTES; a 64th of a small filesystem, in whole pages, at least one."""
    assert reserve_size(10 * 1024 * MIB) == RESERVE_BYTES
    assert reserve_size(60 * MIB) == 960 * 1024
    assert reserve_size(4 * MIB) == 64 * 1024
    assert reserve_size(4 * MIB + 123) % 4096 == 0
    assert reserve_size(0) == 4096


def test_the_reserve_is_taken_only_with_room_to_spare() -> None:
    """Never from the last bytes the trainer needs: ROOM_FACTOR times its size free."""
    assert worth_arming(ROOM_FACTOR * MIB, MIB)
    assert not worth_arming(ROOM_FACTOR * MIB - 1, MIB)
    assert not worth_arming(0, 4096)


def test_arm_and_release(tmp_path: Path) -> None:
    """Armed, the file holds its size; released once, it is gone and a second release has
    nothing to give; armed again, it is back."""
    reserve = Reserve.in_state_dir(tmp_path)
    assert reserve.arm()
    assert reserve.armed
    assert reserve.path.stat().st_size == reserve.size > 0
    assert reserve.release()
    assert not reserve.armed
    assert not reserve.release()
    assert reserve.arm()
    assert reserve.armed

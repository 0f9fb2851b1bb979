"""Retention policy: exhaustive checks of the invariants over many shapes of history."""

from __future__ import annotations

import itertools

import pytest
from traind.checkpoints.retention.policy import (
    Candidate,
    Stranded,
    plan_local,
    plan_remote,
    stranded,
)

from traind.config import RetentionConfig
from traind.layout.manifest import Writer
from traind.layout.parts import Part


def ckpts(*steps: int) -> list[Candidate]:
    return [Candidate(f"checkpoint-{s}", s) for s in steps]


def kept(verdicts: list, keep: bool = True) -> set[str]:  # type: ignore[type-arg]
    return {v.tag for v in verdicts if v.keep is keep}


def test_keep_last() -> None:
    """The newest keep_last stay, the rest go, each with a reason."""
    v = plan_remote(ckpts(100, 200, 300, 400), RetentionConfig(keep_last=2, keep_best=False))
    assert kept(v) == {"checkpoint-300", "checkpoint-400"}
    assert all(x.reason for x in v)


def test_keep_every_steps() -> None:
    """Multiples of keep_every_steps are kept forever."""
    policy = RetentionConfig(keep_last=1, keep_every_steps=1000, keep_best=False)
    v = plan_remote(ckpts(500, 1000, 1500, 2000, 2500), policy)
    assert kept(v) == {"checkpoint-1000", "checkpoint-2000", "checkpoint-2500"}


def test_keep_best() -> None:
    """The trainer's best checkpoint stays when keep_best is on, goes when off."""
    c = ckpts(1, 2, 3, 4)
    assert "checkpoint-1" in kept(plan_remote(c, RetentionConfig(keep_last=1), "checkpoint-1"))
    off = RetentionConfig(keep_last=1, keep_best=False)
    assert "checkpoint-1" not in kept(plan_remote(c, off, "checkpoint-1"))


def test_protected_is_kept() -> None:
    """A checkpoint being restored is never deleted."""
    v = plan_remote(ckpts(1, 2, 3), RetentionConfig(keep_last=1), protected={"checkpoint-1"})
    assert kept(v) == {"checkpoint-1", "checkpoint-3"}


def test_order_is_by_step_not_input_order() -> None:
    """Newest means highest step, whatever order the store listed them in."""
    v = plan_remote(ckpts(30, 10, 20), RetentionConfig(keep_last=1, keep_best=False))
    assert kept(v) == {"checkpoint-30"}


@pytest.mark.parametrize("keep_last", [1, 2, 3, 7])
@pytest.mark.parametrize("every", [None, 2, 3])
@pytest.mark.parametrize("best", [None, 1, 4])
def test_invariants_over_histories(keep_last: int, every: int | None, best: int | None) -> None:
    """For every subset of steps 1..6: the newest is kept, exactly the listed tags get one
    verdict each, and at least min(keep_last, n) are kept."""
    policy = RetentionConfig(keep_last=keep_last, keep_every_steps=every, keep_best=True)
    for n in range(1, 7):
        for steps in itertools.combinations(range(1, 7), n):
            c = ckpts(*steps)
            v = plan_remote(c, policy, f"checkpoint-{best}" if best else None)
            assert {x.tag for x in v} == {x.tag for x in c}
            assert f"checkpoint-{max(steps)}" in kept(v)
            assert len(kept(v)) >= min(keep_last, n)
            for x in v:
                if not x.keep:
                    assert every is None or x.step % every != 0
                    assert best is None or x.step != best


def test_local_never_deletes_uncommitted_or_newest() -> None:
    """Locally only committed checkpoints beyond keep_local go."""
    present = ckpts(1, 2, 3, 4)
    committed = {"checkpoint-1", "checkpoint-3", "checkpoint-4"}
    v = plan_local(present, committed, keep_local=1)
    assert kept(v, keep=False) == {"checkpoint-1", "checkpoint-3"}
    assert {x.reason for x in v if x.tag == "checkpoint-2"} == {"not committed yet"}


def test_local_off_and_protected() -> None:
    """keep_local unset keeps everything; protected checkpoints stay."""
    present = ckpts(1, 2, 3)
    all_committed = {c.tag for c in present}
    assert kept(plan_local(present, all_committed, None), keep=False) == set()
    v = plan_local(present, all_committed, 1, protected={"checkpoint-1"})
    assert kept(v, keep=False) == {"checkpoint-2"}


def part(rank: int, created_at: float, tag: str = "checkpoint-4", nodes: int = 3) -> Part:
    return Part("exp", tag, 4, rank, nodes, Writer(str(rank) * 32, f"node{rank}"), (),
                created_at=created_at)


def test_parts_that_stopped_arriving_are_given_up_after_part_timeout() -> None:
    """A checkpoint missing node 2's part is given up once its newest part is part_timeout
    old, with the ranks present and missing and the age; not a second before."""
    parts = {"checkpoint-4": [part(0, 100.0), part(1, 160.0)]}
    assert stranded(parts, 3, 159.9 + 3600, 3600.0) == []
    assert stranded(parts, 3, 160.0 + 3600, 3600.0) == [
        Stranded("checkpoint-4", 4, (0, 1), (2,), 3600.0)]


def test_a_complete_set_of_parts_is_never_given_up() -> None:
    """Every rank's part stored and no manifest (a waiting host commits it, or the parts
    disagree and are kept): never given up, however old."""
    parts = {"checkpoint-4": [part(r, 100.0) for r in range(3)]}
    assert stranded(parts, 3, 1e9, 3600.0) == []


def test_each_tag_is_judged_on_its_own_parts() -> None:
    """Of two uncommitted tags only the one whose parts stopped coming goes; a tag with no
    part (nothing stored yet) is not judged at all."""
    parts = {"checkpoint-4": [part(0, 100.0, "checkpoint-4")],
             "checkpoint-5": [part(0, 5000.0, "checkpoint-5")], "checkpoint-6": []}
    assert [s.tag for s in stranded(parts, 2, 5000.0, 3600.0)] == ["checkpoint-4"]

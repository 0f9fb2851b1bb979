"""The resume point of a multi-node job: who is covered, who is missing, what is picked."""

from __future__ import annotations

import fnmatch
import itertools

import pytest

from traind.checkpoints.intake.watcher import tag_problem
from traind.checkpoints.multinode.agreement import (
    Board,
    Committed,
    ResumeDecision,
    covers,
    decide,
    fresh,
    newest,
    tally,
)
from traind.errors import IntegrityError
from traind.layout.keys import AGREEMENT_DIR

C2, C3, C4 = (Committed(f"checkpoint-{s}", s, float(s)) for s in (2, 3, 4))


def decision(round_: int, tag: str | None, **nonces: str) -> ResumeDecision:
    step = None if tag is None else int(tag.rsplit("-", 1)[1])
    return ResumeDecision(round_, tag, step, {int(r[1:]): n for r, n in nonces.items()}, 1.0)


def test_reserved_name_is_never_a_checkpoint_tag() -> None:
    """The agreement's directory beside the tags matches no checkpoint pattern and is no tag
    (no step number), so it is never listed, restored or pruned as one."""
    assert tag_problem(AGREEMENT_DIR) is not None
    assert not fnmatch.fnmatchcase(AGREEMENT_DIR, "checkpoint-*")
    assert not fnmatch.fnmatchcase(AGREEMENT_DIR, "*-*[0-9]")


def test_covers_only_the_rank_and_nonce_decided_for() -> None:
    """A decision answers exactly the requests it names: another rank's nonce, an older or
    a newer nonce of the same rank, an empty board or none at all answer nothing."""
    board = Board(decision(1, "checkpoint-2", r0="a", r1="b"))
    assert covers(board, 0, "a") == board.decision
    assert covers(board, 1, "b") == board.decision
    assert covers(board, 1, "a") is None
    assert covers(board, 0, "c") is None
    assert covers(board, 2, "a") is None
    assert covers(Board(), 0, "a") is None
    assert covers(None, 0, "a") is None


_STATES = ("none", "covered", "fresh")


def _requests(states: tuple[str, ...]) -> tuple[dict[int, str], set[int]]:
    """The requests of ranks in ``states`` and the ranks whose request is fresh."""
    return ({r: ("old" if s == "covered" else f"new{r}") for r, s in enumerate(states)
             if s != "none"}, {r for r, s in enumerate(states) if s == "fresh"})


@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
@pytest.mark.parametrize("with_last", [False, True])
def test_tally_every_combination_of_requests(nodes: int, with_last: bool) -> None:
    """For every rank without a request, with one the last decision covers, or with a fresh
    one: only the fresh ones are seen, every other rank is missing, the last decision is
    kept; with no last decision a covered nonce counts as fresh."""
    last = decision(3, "checkpoint-2", **{f"r{r}": "old" for r in range(nodes)})
    for states in itertools.product(_STATES, repeat=nodes):
        requests, new = _requests(states)
        board = tally(nodes, Board(last) if with_last else None, requests)
        seen = set(requests) if not with_last else new
        assert set(board.seen) == seen, states
        assert board.seen == {r: requests[r] for r in seen}
        assert board.missing == tuple(r for r in range(nodes) if r not in seen)
        assert board.decision == (last if with_last else None)


def test_tally_ignores_ranks_outside_the_job() -> None:
    """A request of a rank the job does not have (a stale one of a bigger job) is neither
    seen nor waited for."""
    board = tally(2, None, {0: "a", 1: "b", 5: "z"})
    assert board.seen == {0: "a", 1: "b"}
    assert board.missing == ()


def test_fresh_is_what_the_last_decision_does_not_cover() -> None:
    """A rank asking again (a new nonce) is fresh; one still on the decided nonce is not."""
    last = decision(1, None, r0="a", r1="b")
    assert fresh({0: "a", 1: "c"}, last) == {1: "c"}
    assert fresh({0: "a", 1: "b"}, None) == {0: "a", 1: "b"}


@pytest.mark.parametrize(
    ("committed", "tag"),
    [
        ([], None),
        ([C2], "checkpoint-2"),
        ([C3, C2, C4], "checkpoint-4"),
        ([C4, Committed("other-4", 4, 9.0), C2], "other-4"),  # same step: the latest made
    ],
)
def test_decide_picks_the_newest_committed_or_none(
    committed: list[Committed], tag: str | None
) -> None:
    """The decision names the committed checkpoint with the highest step (ties: the latest
    made), or none; it covers exactly the requests seen, in the next round."""
    tallied = Board(decision(4, "checkpoint-1", r0="x", r1="y"), {0: "a", 1: "b"}, ())
    board = decide(tallied, committed, 7.0)
    assert board.decision is not None
    assert (board.decision.tag, board.decision.round) == (tag, 5)
    assert board.decision.nonces == {0: "a", 1: "b"}
    assert board.decision.step == (None if tag is None else 4 if tag != "checkpoint-2" else 2)
    assert (board.seen, board.missing) == ({}, ())
    assert newest(committed) == (None if tag is None else
                                 next(c for c in committed if c.tag == tag))


def test_decide_refuses_while_a_rank_is_missing() -> None:
    """No decision is made for a round that misses a rank (the caller's bug, loudly)."""
    with pytest.raises(ValueError, match="missing"):
        decide(Board(None, {0: "a"}, (1,)), [C2], 1.0)


def test_first_decision_is_round_one() -> None:
    """With no board before, the first decision is round 1."""
    board = decide(tally(1, None, {0: "a"}), [], 1.0)
    assert board.decision == ResumeDecision(1, None, None, {0: "a"}, 1.0)


def test_board_round_trip_and_malformed() -> None:
    """The board keeps every field through its JSON form; a malformed one is an
    IntegrityError naming the board."""
    for board in (Board(), Board(decision(2, "checkpoint-3", r0="a", r1="b"), {1: "c"}, (0,)),
                  Board(decision(1, None, r0="a"))):
        assert Board.from_json(board.to_json()) == board
    for bad in (b"{", b"[]", b'{"decision": null}',
                b'{"decision": {"round": 1, "tag": "../x", "step": 1, "decided_at": 0, '
                b'"nonces": {}}, "seen": {}, "missing": []}'):
        with pytest.raises(IntegrityError, match="resume board"):
            Board.from_json(bad)



@pytest.mark.parametrize("bad", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"decision": {"round": 1, "tag": null, "step": null, "decided_at": NaN, '
    b'"nonces": {}}, "seen": {}, "missing": []}',
    b'{"decision": {"round": 1, "tag": "checkpoint-1", "step": 18446744073709551616, '
    b'"decided_at": 0, "nonces": {}}, "seen": {}, "missing": []}',
    rb'{"decision": null, "seen": {"\u00b2": "a"}, "missing": []}',
    b'{"decision": null, "seen": {"0": ["a"]}, "missing": []}',
    b'{"decision": null, "seen": {}, "missing": [true]}',
], ids=["nested", "nan", "step-past-2**63", "superscript-rank", "nonce-not-text", "bool-rank"])
def test_a_board_that_lies_is_one_clear_error(bad: bytes) -> None:
    """A board nested too deeply, with a NaN time, a step past 2**63, a rank that is no
    ASCII number or a nonce that is no string is an IntegrityError naming the board (node 0
    then writes it anew), never a RecursionError or a NaN decision."""
    with pytest.raises(IntegrityError, match="malformed resume board: "):
        Board.from_json(bad)


def _simulate(order: tuple[str, ...], nodes: int) -> dict[int, ResumeDecision]:
    """Play one interleaving of the hosts' requests (``R<rank>``), commits landing (``C``)
    and node 0's polls (``P``), then poll until decided; return the decision each rank
    was covered by."""
    committed = [C2]
    board: Board | None = None
    requests: dict[int, str] = {}

    def poll() -> None:
        nonlocal board
        tallied = tally(nodes, board, requests)
        board = tallied if tallied.missing else decide(tallied, committed, 0.0)

    got: dict[int, ResumeDecision] = {}
    for event in order:
        if event == "C":
            committed.append(Committed(f"checkpoint-{len(committed) + 2}", len(committed) + 2))
        elif event == "P":
            poll()
        else:
            requests[int(event[1:])] = f"nonce{event}"
        for rank, nonce in requests.items():
            if (d := covers(board, rank, nonce)) is not None:
                got.setdefault(rank, d)
    poll()
    for rank, nonce in requests.items():
        if (d := covers(board, rank, nonce)) is not None:
            got.setdefault(rank, d)
    return got


@pytest.mark.parametrize("nodes", [2, 3])
def test_no_interleaving_of_requests_commits_and_polls_splits_the_hosts(nodes: int) -> None:
    """Over every order of the hosts' requests, two commits landing and node 0's polls: all
    hosts are covered by one decision, of the newest checkpoint committed by the time the
    last request was counted (never node 0 from checkpoint-4 and node 1 from 3)."""
    events = [f"R{r}" for r in range(nodes)] + ["C", "C", "P", "P"]
    for order in set(itertools.permutations(events)):
        got = _simulate(order, nodes)
        assert sorted(got) == list(range(nodes)), order
        assert len(set(map(_key, got.values()))) == 1, order
        last_request = max(order.index(f"R{r}") for r in range(nodes))
        polls_after = [i for i, e in enumerate(order) if e == "P" and i > last_request]
        decided_at = polls_after[0] if polls_after else len(order)
        commits = order[:decided_at].count("C")
        assert got[0].step == 2 + commits, order


def _key(d: ResumeDecision) -> tuple[int, str | None]:
    return d.round, d.tag

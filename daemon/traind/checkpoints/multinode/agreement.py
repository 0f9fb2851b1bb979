"""The resume point of a multi-node job: one decision per (re)start that every host waits for.

Before each trainer start a host stores a start request for its rank (a fresh random nonce,
replacing its last one). Node 0 lists the requests and, once every rank has one the previous
decision does not cover, decides: the newest checkpoint committed globally (its union
manifest exists), or none. The decision, and what node 0 is still waiting for, live in one
small object, the board, which every host polls until the decision covers its nonce: hosts
restarting at different moments, with a commit landing in between, still start from the
same checkpoint. Pure: ``tally`` and ``decide`` are handed what the store holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from traind.layout.fields import (
    INT_LIMIT,
    count,
    decimal,
    obj,
    optional,
    read,
    real,
    shown,
    text,
)
from traind.layout.keys import check_tag


@dataclass(frozen=True)
class Committed:
    """A checkpoint committed globally, as the decision needs it."""

    tag: str
    step: int
    created_at: float = 0.0


@dataclass(frozen=True)
class ResumeDecision:
    """The resume point of one round: ``tag`` at ``step`` (None: start from scratch), for
    the start requests ``nonces`` (rank → nonce), decided at ``decided_at``."""

    round: int
    tag: str | None
    step: int | None
    nonces: Mapping[int, str]
    decided_at: float


@dataclass(frozen=True)
class Board:
    """The one object every host polls: the last decision, and the requests node 0 has
    counted towards the next one (``seen``) with the ranks still ``missing``."""

    decision: ResumeDecision | None = None
    seen: Mapping[int, str] = field(default_factory=dict)
    missing: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        """The board's body in the store."""
        d = self.decision
        body = {
            "decision": None if d is None else {
                "round": d.round, "tag": d.tag, "step": d.step, "decided_at": d.decided_at,
                "nonces": {str(r): n for r, n in sorted(d.nonces.items())},
            },
            "seen": {str(r): n for r, n in sorted(self.seen.items())},
            "missing": list(self.missing),
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Board:
        """Parse a stored board; raise IntegrityError when it is malformed."""
        return read(data, "resume board", cls._of)

    @classmethod
    def _of(cls, raw: Mapping[str, Any]) -> Board:
        d = None if raw["decision"] is None else obj(raw, "decision")
        decision = None if d is None else ResumeDecision(
            round=count(d, "round"),
            tag=optional(d, "tag", lambda o, k: check_tag(text(o, k))),
            step=optional(d, "step", count),
            nonces=_ranks(obj(d, "nonces")),
            decided_at=real(d, "decided_at"),
        )
        missing = raw["missing"]
        if not isinstance(missing, list) or not all(
                type(r) is int and 0 <= r < INT_LIMIT for r in missing):
            raise ValueError(f"missing {shown(missing)} is not a list of node ranks")
        return cls(decision, _ranks(obj(raw, "seen")), tuple(missing))


def _ranks(raw: Mapping[str, Any]) -> dict[int, str]:
    """A board's rank → nonce object (ranks as decimal JSON keys)."""
    return {_rank(rank): text(raw, rank) for rank in raw}


def _rank(key: str) -> int:
    if (rank := decimal(key)) is None:
        raise ValueError(f"{shown(key)} is not a node rank")
    return rank


def covers(board: Board | None, rank: int, nonce: str) -> ResumeDecision | None:
    """The decision on ``board`` that answers node ``rank``'s request ``nonce``, if any."""
    if board is None or board.decision is None:
        return None
    return board.decision if board.decision.nonces.get(rank) == nonce else None


def fresh(requests: Mapping[int, str], decision: ResumeDecision | None) -> dict[int, str]:
    """The requests the previous ``decision`` does not cover (a rank asking again)."""
    done = decision.nonces if decision is not None else {}
    return {rank: nonce for rank, nonce in requests.items() if done.get(rank) != nonce}


def newest(committed: Iterable[Committed]) -> Committed | None:
    """The checkpoint every host resumes from: the highest step (ties: the latest made)."""
    return max(committed, key=lambda c: (c.step, c.created_at), default=None)


def tally(nodes: int, board: Board | None, requests: Mapping[int, str]) -> Board:
    """Node 0's view of the ranks' ``requests`` (rank → nonce; ranks outside 0..nodes-1
    are ignored): the last decision, the requests it does not cover, and the ranks with
    none yet; a decision is due when no rank is missing."""
    last = board.decision if board is not None else None
    wanted = {r: n for r, n in fresh(requests, last).items() if 0 <= r < nodes}
    return Board(last, wanted, tuple(r for r in range(nodes) if r not in wanted))


def decide(tallied: Board, committed: Iterable[Committed], now: float) -> Board:
    """The board once ``tallied`` misses no rank: a new decision for the requests seen,
    resuming from the newest of ``committed`` (or from scratch when there is none)."""
    if tallied.missing:
        raise ValueError(f"no decision while nodes {list(tallied.missing)} are missing")
    last, pick = tallied.decision, newest(committed)
    return Board(ResumeDecision(
        round=(last.round + 1) if last is not None else 1,
        tag=pick.tag if pick is not None else None,
        step=pick.step if pick is not None else None,
        nonces=dict(tallied.seen),
        decided_at=now,
    ))

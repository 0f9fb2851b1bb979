"""When is a checkpoint directory complete? A pure decision, tested without I/O.

A directory becomes a candidate when one of its completion markers exists; it is snapshot
at once (the trainer may rotate it away within milliseconds) and re-snapshot whenever its
contents change. It is complete when the explicit traind marker exists, when nothing in it
has changed for ``settle`` seconds, or when the trainer removed it after we snapshot it
(trainers rotate only checkpoints they have finished). mtimes are compared for change only,
never used to order checkpoints. Once the writer is gone (the daemon stopped the trainer)
nothing changes any more, so at shutdown a marked directory is complete without settling.

In a multi-node job the markers that trainers write on one rank only (``trainer_state.json``
from HF Trainer's world rank 0, ``.metadata`` from DCP's coordinator) exist on node 0's disk
alone. There they gate the part as on one host; on every other host (``unmarked_settles``)
a directory holding files becomes a candidate without a marker and is complete once quiet for
``settle``, or at once with ``TraindCallback``'s marker, which it writes on every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

Signature = frozenset[tuple[str, int, int]]
"""Every file of a directory as (relative path, size, mtime_ns)."""


@dataclass(frozen=True)
class Observation:
    """What one scan saw of a checkpoint directory."""

    signature: Signature
    has_marker: bool
    explicit: bool

    @property
    def marked(self) -> bool:
        """A completion marker (the trainer's or traind's own) is present."""
        return self.has_marker or self.explicit


@dataclass(frozen=True)
class Tracked:
    """A candidate already snapshot: the signature of that snapshot, and since when."""

    signature: Signature
    since: float


class ScanAction(Enum):
    """What to do with a directory after a scan."""

    WAIT = "wait"
    STAGE = "stage"
    COMPLETE = "complete"
    IGNORE = "ignore"


def unmarked_settles(node_rank: int, nodes: int) -> bool:
    """Whether this host takes a checkpoint directory without a marker as a candidate: every
    host of a multi-node job but node 0, which holds the coordinator's markers (the host of
    world rank 0, as ``torchrun --node-rank`` and the schedulers' node ranks make it)."""
    return nodes > 1 and node_rank > 0


def decide(tracked: Tracked | None, seen: Observation | None, now: float, settle: float,
           unmarked_settles: bool = False) -> ScanAction:
    """Decide the next step for one checkpoint directory; with ``unmarked_settles`` one
    holding a file needs no marker to be staged and settle."""
    if seen is None:
        return ScanAction.COMPLETE if tracked is not None else ScanAction.IGNORE
    if not marked(seen, unmarked_settles):
        return ScanAction.WAIT
    if tracked is None or seen.signature != tracked.signature:
        return ScanAction.STAGE
    if seen.explicit or now - tracked.since >= settle:
        return ScanAction.COMPLETE
    return ScanAction.WAIT


def marked(seen: Observation, unmarked_settles: bool = False) -> bool:
    """Whether ``seen`` counts as marked: it holds a marker, or (``unmarked_settles``) any
    file at all."""
    return seen.marked or (unmarked_settles and bool(seen.signature))


def decide_at_stop(tracked: Tracked | None, seen: Observation | None, writer_gone: bool,
                   unmarked_settles: bool = False) -> ScanAction:
    """Decide for one directory in the last scan before shutdown: with the writer gone every
    marked directory (see ``marked``) is complete (snapshot first if this one is not, or
    has changed); otherwise only traind's explicit marker says so."""
    if seen is None:
        return ScanAction.COMPLETE if tracked is not None else ScanAction.IGNORE
    if not marked(seen, unmarked_settles) or not (writer_gone or seen.explicit):
        return ScanAction.IGNORE
    if tracked is None or seen.signature != tracked.signature:
        return ScanAction.STAGE
    return ScanAction.COMPLETE


def settles_in(tracked: Tracked, now: float, settle: float) -> float:
    """Seconds until a snapshot candidate that stays as ``tracked`` saw it is complete by
    settling: what a stop without a writer of its own waits for."""
    return max(0.0, tracked.since + settle - now)

"""Retention: which checkpoints to delete, as pure functions with their reasons.

Never deleted: the newest committed checkpoint, the trainer's best (with ``keep_best``),
anything protected (being restored), and — locally — anything not yet committed. In a
multi-node job, an uncommitted checkpoint whose parts stopped arriving (``stranded``) goes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from traind.config import RetentionConfig
from traind.layout.parts import Part


@dataclass(frozen=True)
class Candidate:
    """A checkpoint as retention sees it."""

    tag: str
    step: int


@dataclass(frozen=True)
class Verdict:
    """Keep or delete one checkpoint, and why."""

    tag: str
    step: int
    keep: bool
    reason: str


def plan_remote(
    committed: Sequence[Candidate],
    policy: RetentionConfig,
    best: str | None = None,
    protected: Collection[str] = (),
) -> list[Verdict]:
    """Decide, for every committed checkpoint in the store, whether it stays."""
    ordered = sorted(committed, key=lambda c: c.step, reverse=True)
    verdicts = []
    for rank, c in enumerate(ordered):
        if rank == 0:
            reason = "newest"
        elif rank < policy.keep_last:
            reason = f"among the last {policy.keep_last}"
        elif policy.keep_every_steps and c.step % policy.keep_every_steps == 0:
            reason = f"step is a multiple of keep_every_steps={policy.keep_every_steps}"
        elif policy.keep_best and best is not None and c.tag == best:
            reason = "trainer's best checkpoint"
        elif c.tag in protected:
            reason = "being restored"
        else:
            why = f"older than the last {policy.keep_last}"
            verdicts.append(Verdict(c.tag, c.step, False, why))
            continue
        verdicts.append(Verdict(c.tag, c.step, True, reason))
    return verdicts


def plan_local(
    present: Sequence[Candidate],
    committed: Collection[str],
    keep_local: int | None,
    protected: Collection[str] = (),
) -> list[Verdict]:
    """Decide, for every checkpoint directory in output_dir, whether it stays on disk."""
    ordered = sorted(present, key=lambda c: c.step, reverse=True)
    verdicts = []
    for rank, c in enumerate(ordered):
        if keep_local is None:
            reason = "keep_local is off"
        elif rank < keep_local:
            reason = f"among the last {keep_local} on disk"
        elif c.tag not in committed:
            reason = "not committed yet"
        elif c.tag in protected:
            reason = "in use"
        else:
            why = f"committed, older than the last {keep_local}"
            verdicts.append(Verdict(c.tag, c.step, False, why))
            continue
        verdicts.append(Verdict(c.tag, c.step, True, reason))
    return verdicts


@dataclass(frozen=True)
class Stranded:
    """An uncommitted multi-node checkpoint given up: the ranks whose parts are stored and
    those missing, and how long ago (seconds) the newest part arrived."""

    tag: str
    step: int
    present: tuple[int, ...]
    missing: tuple[int, ...]
    age: float


def stranded(
    uncommitted: Mapping[str, Sequence[Part]], nodes: int, now: float, timeout: float
) -> list[Stranded]:
    """The checkpoints of ``uncommitted`` (tag → its stored parts) whose parts never all
    arrived: a rank of 0..nodes-1 is missing and no part came for ``timeout`` seconds (a
    host still sending is waited for). A complete set is never given up: a waiting host
    commits it, or its parts disagree and are kept for inspection."""
    found = []
    for tag, parts in sorted(uncommitted.items()):
        if not parts:
            continue
        present = tuple(sorted({p.node_rank for p in parts}))
        missing = tuple(rank for rank in range(nodes) if rank not in present)
        age = now - max(p.created_at for p in parts)
        if missing and age >= timeout:
            found.append(Stranded(tag, parts[0].step, present, missing, age))
    return found

"""Coalescing: which waiting checkpoints a newer one makes not worth a commit, on a store
that limits commits (the Hub allows about 128 an hour per repo).

Pure. A trainer saving faster than the store takes commits would otherwise fall ever
further behind, and the newest checkpoint, the one a restart resumes from, would wait
behind old ones. So when a newer checkpoint is waiting, an older one is skipped — unless
it is pinned: a multiple of ``keep_every_steps``, which retention would keep anyway.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from traind.checkpoints.intake.watcher import parse_step


def pinned(step: int, keep_every_steps: int) -> bool:
    """Whether retention keeps ``step`` however many newer ones there are."""
    return bool(keep_every_steps) and step % keep_every_steps == 0


def superseded_by(step: int, waiting: Collection[int], keep_every_steps: int) -> int | None:
    """The newest of ``waiting`` (the steps of the other checkpoints waiting) when it makes
    ``step`` not worth a commit; None when ``step`` is to be committed (the newest, or
    pinned)."""
    newer = max((s for s in waiting if s > step), default=None)
    if newer is None or pinned(step, keep_every_steps):
        return None
    return newer


def newer_tag(tag: str, waiting: Iterable[str], keep_every_steps: int) -> str | None:
    """``superseded_by`` for tags: the waiting tag that makes ``tag`` not worth a commit."""
    steps = {parse_step(t): t for t in waiting if t != tag}
    step = parse_step(tag)
    if step is None:
        return None
    newer = superseded_by(step, [s for s in steps if s is not None], keep_every_steps)
    return None if newer is None else steps[newer]

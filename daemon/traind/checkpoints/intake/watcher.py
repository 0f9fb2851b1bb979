"""The watcher: finds complete checkpoint directories in the trainer's output_dir.

Wake-ups come from inotify (``wakeups.py``); a scan also runs every ``poll_interval`` so
the settle timer advances, and with ``force_polling`` (NFS) those scans alone find
checkpoints. Everything already on disk at start-up is picked up by the first scan.
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from enum import Enum
from pathlib import Path

import structlog

from traind.checkpoints.intake.completion import (
    Observation,
    ScanAction,
    Tracked,
    decide,
    decide_at_stop,
    marked,
    settles_in,
)
from traind.checkpoints.intake.snapshot import observe
from traind.checkpoints.intake.wakeups import Changes
from traind.config import CheckpointsConfig
from traind.errors import UnsafePathError
from traind.layout.fields import INT_LIMIT, decimal
from traind.layout.keys import check_tag

log = structlog.get_logger("traind.watcher")
_STEP = re.compile(r"(\d+)$")


class StageResult(Enum):
    """What became of an attempt to snapshot a checkpoint."""

    STAGED = "staged"
    GONE = "gone"  # vanished first, or unusable for good: give up on it
    RETRY = "retry"  # a passing failure (disk full, permissions): try again next scan


OnStage = Callable[[str, int, Path], Awaitable[StageResult]]
OnComplete = Callable[[str, int], Awaitable[None]]


def parse_step(tag: str) -> int | None:
    """The step number at the end of a checkpoint directory name, if any (below
    INT_LIMIT: what a manifest and the journal hold)."""
    m = _STEP.search(tag)
    return decimal(m[1]) if m else None


def tag_problem(name: str) -> str | None:
    """Why the directory ``name`` cannot be a checkpoint tag, or None when it can."""
    try:
        check_tag(name)
    except UnsafePathError as exc:
        return str(exc)
    if _STEP.search(name) is None:
        return f"no step number at the end of {name!r}"
    if parse_step(name) is None:
        return f"the step number at the end of {name!r} is not below 2**63 ({INT_LIMIT})"
    return None


def listing(output_dir: Path, pattern: str) -> tuple[dict[str, int], dict[str, str]]:
    """Directories in ``output_dir`` matching ``pattern``: tag → step of those that are
    checkpoints, and name → why not of the others (``checkpoint-201 copy 2``)."""
    found: dict[str, int] = {}
    odd: dict[str, str] = {}
    try:
        entries = list(output_dir.iterdir())
    except FileNotFoundError:
        return found, odd
    for entry in entries:
        name = entry.name
        if fnmatch.fnmatchcase(name, pattern) and not entry.is_symlink() and entry.is_dir():
            if (problem := tag_problem(name)) is not None:
                odd[name] = problem
            else:
                found[name] = parse_step(name) or 0
    return found, odd


def candidates(output_dir: Path, pattern: str) -> dict[str, int]:
    """Directories in ``output_dir`` matching ``pattern`` that are checkpoints: tag → step."""
    return listing(output_dir, pattern)[0]


class Watcher:
    """Scans ``output_dir`` and drives each candidate through stage → complete.

    ``on_stage(tag, step, path)`` snapshots and says whether that worked, the checkpoint is
    to be given up, or it is to be tried again; ``on_complete(tag, step)`` hands the
    snapshot on. Tags in ``done`` are never looked at again.
    """

    def __init__(
        self,
        config: CheckpointsConfig,
        output_dir: Path,
        on_stage: OnStage,
        on_complete: OnComplete,
        done: set[str],
        tracked: Iterable[str] = (),
        unmarked_settles: bool = False,
        after_scan: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._config = config
        self._after_scan = after_scan
        """Run after each scan of the running watcher: a rotation the trainer just made is
        met at once (the free-space check), before its next save."""
        self._unmarked_settles = unmarked_settles
        """A host of a multi-node job that never sees the coordinator's markers (see
        ``completion.unmarked_settles``)."""
        self._dir = output_dir
        self._on_stage = on_stage
        self._on_complete = on_complete
        self._done = done
        # Snapshots that survived a restart count as taken, but not as settled.
        start = time.monotonic()
        self._tracked: dict[str, Tracked] = {t: Tracked(frozenset(), start) for t in tracked}
        self._skipped: set[str] = set()
        """Names matching the pattern that are no checkpoint tag, each warned about once."""
        self._scanning = asyncio.Lock()
        """One pass at a time: a final scan never interleaves with the running watcher's."""
        self._settled = asyncio.Event()
        """Set after a scan that left no candidate waiting to settle."""

    @property
    def tracking(self) -> int:
        """How many candidates are snapshot but not yet complete."""
        return len(self._tracked)

    def unsettled(self) -> dict[str, float]:
        """The candidates snapshot but not yet complete, newest first, each with the seconds
        until it settles if nothing in it changes."""
        now = time.monotonic()
        return {tag: round(settles_in(t, now, self._config.settle), 3) for tag, t in
                sorted(self._tracked.items(), key=lambda kv: parse_step(kv[0]) or 0,
                       reverse=True)}

    async def settled(self) -> None:
        """Return once a scan (of the running watcher) leaves no candidate waiting to
        settle: every marked directory it found is handed on as complete."""
        await self._settled.wait()

    def reopen(self, tag: str) -> None:
        """Look at ``tag`` again, as if never seen: its snapshot was found rewritten."""
        self._done.discard(tag)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Scan on every wake-up until cancelled, or until ``stop`` is set (a scan under way
        finishes first, so no snapshot is left half taken)."""
        self._dir.mkdir(parents=True, exist_ok=True)
        async for _ in self._wakeups(stop or asyncio.Event()):
            await self.scan()

    async def final_scan(self, writer_gone: bool) -> list[str]:
        """A pass that waits for no settling, newest first: at shutdown, or once the
        trainer finished. Hands on every checkpoint that ``decide_at_stop`` calls complete
        and returns the marked ones it could not hand on; a directory without a marker (a
        save cut short) is only warned about."""
        async with self._scanning:
            return await self._final_scan(writer_gone)

    async def _final_scan(self, writer_gone: bool) -> list[str]:
        found = await asyncio.to_thread(candidates, self._dir, self._config.pattern)
        for tag in self._tracked:
            found.setdefault(tag, parse_step(tag) or 0)
        left = []
        for tag, step in sorted(found.items(), key=lambda kv: kv[1], reverse=True):
            if tag in self._done:
                continue
            seen = await asyncio.to_thread(observe, self._dir / tag, self._config.markers)
            action = decide_at_stop(self._tracked.get(tag), seen, writer_gone,
                                    self._unmarked_settles)
            if action is ScanAction.STAGE and seen is not None:
                result = await self._on_stage(tag, step, self._dir / tag)
                if result is StageResult.GONE:
                    continue  # vanished or unusable: already logged
                action = ScanAction.COMPLETE if result is StageResult.STAGED else ScanAction.WAIT
            if action is ScanAction.COMPLETE:
                self._tracked.pop(tag, None)
                self._done.add(tag)
                await self._on_complete(tag, step)
            elif seen is not None and marked(seen, self._unmarked_settles):
                left.append(tag)
            elif seen is not None:
                log.warning("checkpoint_incomplete_at_stop", tag=tag, step=step,
                            reason="no completion marker: the save was cut short")
        return left

    async def scan(self) -> None:
        """One pass over the output directory."""
        async with self._scanning:
            await self._scan()

    async def _scan(self) -> None:
        found, odd = await asyncio.to_thread(listing, self._dir, self._config.pattern)
        for name in odd.keys() - self._skipped:
            self._skipped.add(name)
            log.warning("checkpoint_name_skipped", name=name, reason=odd[name],
                        hint="not stored; a checkpoint directory is named like checkpoint-N")
        for tag in list(self._tracked):
            found.setdefault(tag, parse_step(tag) or 0)
        for tag, step in sorted(found.items(), key=lambda kv: kv[1]):
            if tag in self._done:
                continue
            seen = await asyncio.to_thread(observe, self._dir / tag, self._config.markers)
            await self._advance(tag, step, seen)
        if self._tracked:
            self._settled.clear()
        else:
            self._settled.set()
        if self._after_scan is not None:
            await self._after_scan()

    async def _advance(self, tag: str, step: int, seen: Observation | None) -> None:
        now = time.monotonic()
        action = decide(self._tracked.get(tag), seen, now, self._config.settle,
                        self._unmarked_settles)
        if action is ScanAction.STAGE and seen is not None:
            result = await self._on_stage(tag, step, self._dir / tag)
            if result is StageResult.STAGED:
                self._tracked[tag] = Tracked(seen.signature, now)
            elif result is StageResult.GONE and tag not in self._tracked:
                self._done.add(tag)
        elif action is ScanAction.COMPLETE:
            del self._tracked[tag]
            self._done.add(tag)
            await self._on_complete(tag, step)

    async def _wakeups(self, stop: asyncio.Event) -> AsyncIterator[None]:
        """The start-up scan, then one after each burst of changes under output_dir, and
        one every ``poll_interval`` so the settle timer advances."""
        yield None  # the start-up scan
        async with Changes.open(self._dir, self._config.pattern,
                                self._config.force_polling) as changes:
            while True:
                await changes.wait(stop, self._config.poll_interval)
                if stop.is_set():
                    return
                yield None

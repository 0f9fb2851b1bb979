"""Free space on output_dir's filesystem: training progress comes before old snapshots.

A snapshot of a checkpoint the trainer has rotated away (``save_total_limit``) holds the
only link to its files; while the store is down such snapshots pile up until the trainer's
next save fails. Below the floor, the oldest of them are let go — never the newest. So that
the room is there before the trainer's next save, not after, one whose source the trainer is
about to rotate away (``rotated_next``, from its retention as seen in output_dir) counts as
rotated already; one whose files the trainer keeps is never let go (that would free nothing).
``to_drop`` is the decision; ``SpaceGuard`` measures and acts on it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import candidates, parse_step
from traind.checkpoints.state.identity import RunIdentity, staging_dir
from traind.checkpoints.state.journal import Journal
from traind.checkpoints.state.reserve import Reserve, free_bytes
from traind.errors import JournalError, TraindError

log = structlog.get_logger("traind.space")


@dataclass(frozen=True)
class Pinned:
    """A staged snapshot waiting for the store: its size, the bytes only it holds (freed
    when it goes), and whether the trainer's own directory of it is still there."""

    tag: str
    step: int
    bytes: int
    unique_bytes: int
    source_exists: bool
    rotating: bool = False
    """Its source is one the trainer deletes before its next save (see ``rotated_next``)."""
    in_flight: bool = False
    """Being uploaded: let go only when no other will do (its upload is stopped)."""

    @property
    def frees(self) -> int:
        """The bytes letting go of it frees: now, or once the trainer deletes its source."""
        if not self.source_exists:
            return self.unique_bytes
        return self.bytes if self.rotating else 0


def rotated_next(steps: Iterable[int], keeps: int | None) -> set[int]:
    """The steps of the trainer's checkpoints in output_dir (``steps``) it deletes before its
    next save: all but its ``keeps`` newest; none while its retention is not seen yet (None:
    it may keep every one; its first rotation is met by the check the watcher runs then)."""
    if keeps is None:
        return set()
    ordered = sorted(steps)
    return set(ordered[: max(0, len(ordered) - keeps)])


def retention_seen(keeps: int | None, present: int, rotated: bool) -> int | None:
    """The trainer's retention learnt so far: the fewest checkpoints it held (``present``)
    at a look after it had rotated one away (``rotated``); ``keeps`` until then."""
    if not rotated or present == 0:
        return keeps
    return present if keeps is None else min(keeps, present)


def floor_bytes(factor: float, fixed: int, checkpoint_bytes: int) -> int:
    """The floor: ``fixed`` bytes, or ``factor`` times the size of a checkpoint."""
    return fixed if factor == 0 else int(factor * checkpoint_bytes)


def to_drop(free: int, floor: int, pinned: Sequence[Pinned]) -> list[Pinned]:
    """The snapshots to let go, oldest first (the one in flight last), until ``free`` is
    back at ``floor`` (counting what the trainer's coming rotation frees of them): only ones
    that free bytes (see ``Pinned.frees``), never the newest."""
    if free >= floor or not pinned:
        return []
    newest = max(pinned, key=lambda p: p.step)
    chosen = []
    for p in sorted(pinned, key=lambda p: (p.in_flight, p.step)):
        if free >= floor:
            break
        if p is newest or p.frees == 0:
            continue
        chosen.append(p)
        free += p.frees
    return chosen


def measure(root: Path) -> tuple[int, int]:
    """(size, bytes held only by this snapshot) of the staged snapshot in ``root``."""
    total = unique = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            total += st.st_size
            if st.st_nlink == 1:
                unique += st.st_size
    return total, unique


def _same_filesystem(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` (or, before it exists, its parent) share a filesystem."""
    while not b.exists() and b != b.parent:
        b = b.parent
    return os.stat(a).st_dev == os.stat(b).st_dev


class SpaceGuard:
    """Keeps free space on ``output_dir``'s filesystem at the floor by dropping pinned
    snapshots (see ``to_drop``); ``on_drop`` is told each one (for the metric)."""

    def __init__(
        self,
        output_dir: Path,
        streamer: Streamer,
        journal: Journal,
        floor: tuple[float, int],
        on_drop: Callable[[Pinned], None] | None = None,
        pattern: str = "checkpoint-*",
    ) -> None:
        self._dir = output_dir
        self._pattern = pattern
        self._streamer = streamer
        self._journal = journal
        self._factor, self._fixed = floor
        self._on_drop = on_drop
        self._lock = asyncio.Lock()
        self._short = False  # below the floor with nothing left to drop (warned once)
        self.checkpoint_bytes = 0
        """The largest checkpoint seen: what a ``factor`` floor multiplies."""
        self.trainer_keeps: int | None = None
        """The trainer's retention as seen in output_dir (see ``retention_seen``)."""
        self.full = False
        """At the last check, the trainer's next save would not fit even with everything
        droppable let go: only the newest checkpoint is committed meanwhile."""

    def floor(self) -> int:
        """The free bytes kept on output_dir's filesystem now (0: no floor)."""
        return floor_bytes(self._factor, self._fixed, self.checkpoint_bytes)

    def staged(self, nbytes: int) -> None:
        """A checkpoint of ``nbytes`` was just snapshot."""
        self.checkpoint_bytes = max(self.checkpoint_bytes, nbytes)

    async def check(self) -> list[Pinned]:
        """Measure free space and, below the floor, drop what ``to_drop`` says; return it."""
        if self._factor == 0 and self._fixed == 0:
            return []
        async with self._lock:
            try:
                free = await asyncio.to_thread(free_bytes, self._dir)
            except OSError:  # output_dir not there yet: the trainer has written nothing
                return []
            floor = floor_bytes(self._factor, self._fixed, self.checkpoint_bytes)
            if free >= floor and self.checkpoint_bytes:  # else: sizes from staging, below
                self._short = False
                self._set_full(False)
                return []
            pinned, freed = await self._pinned()
            floor = floor_bytes(self._factor, self._fixed, self.checkpoint_bytes)
            room = free + freed  # what the trainer's next save finds, its rotation done
            dropped = []
            for p in to_drop(room, floor, pinned):
                await self._streamer.drop(p.tag)
                dropped.append(p)
                log.error(
                    "checkpoint_dropped", tag=p.tag, step=p.step, bytes=p.bytes,
                    free_bytes=free, floor=floor,
                    reason="free space on output_dir's filesystem below the floor while "
                           "the store is behind; the trainer had rotated it away"
                           + (" (or does before its next save)" if p.rotating else ""),
                    hint="it is not stored; a newer checkpoint is kept",
                )
                room += p.frees
                if self._on_drop is not None:
                    self._on_drop(p)
            if room < floor and not self._short:
                log.warning(
                    "disk_space_low", output_dir=str(self._dir), free_bytes=free, floor=floor,
                    waiting=len(pinned) - len(dropped),
                    hint="nothing more can be dropped: the trainer's own checkpoints or the "
                         "newest snapshot hold the rest; free space on this filesystem",
                )
            self._short = room < floor
            self._set_full(room < max(self.checkpoint_bytes, 1))
            return dropped

    async def check_safely(self) -> None:
        """One free-space check; a failed one must never stop the daemon or a snapshot."""
        await _logged(self.check())

    async def committed_safely(self, step: int) -> None:
        """``committed``, its failure logged: it must never stop the streamer."""
        await _logged(self.committed(step))

    async def watch(self, interval: Callable[[], float]) -> None:
        """Check every ``interval()`` seconds too: the trainer writes between snapshots."""
        while True:
            await asyncio.sleep(interval())
            await self.check_safely()

    def _set_full(self, full: bool) -> None:
        if full != self.full:
            self._streamer.newest_only(full)
        self.full = full

    async def committed(self, step: int) -> list[str]:
        """A checkpoint of ``step`` was just committed. On a full disk, let go of every
        older one still to commit, with one error naming them: the newest is stored, and
        the journal's room and the trainer's come before older checkpoints."""
        await self.check()
        if not self.full:
            return []
        older = [t for t in self._streamer.unstored
                 if (parse_step(t) or 0) < step and t != self._streamer.in_flight]
        for tag in older:
            size, unique = await asyncio.to_thread(measure, self._streamer.staging / tag)
            await self._streamer.drop(tag)
            if self._on_drop is not None:
                self._on_drop(Pinned(tag, parse_step(tag) or 0, size, unique, False))
        if older:
            log.error(
                "checkpoints_dropped_full_disk", tags=older, kept=step,
                free_bytes=await asyncio.to_thread(free_bytes, self._dir),
                reason="the disk is full: the trainer's next save does not fit; the "
                       "newest checkpoint is stored, these older ones are let go",
                hint="they are not stored; free space on output_dir's filesystem",
            )
        return older

    async def _pinned(self) -> tuple[list[Pinned], int]:
        """The snapshots waiting for the store (the one in flight too), each marked rotating
        when the trainer deletes its source before its next save; and the bytes that
        rotation frees of checkpoints no snapshot holds. None when staging is on another
        filesystem (its copies take no space here)."""
        if not await asyncio.to_thread(_same_filesystem, self._dir, self._streamer.staging):
            return [], 0
        present = await asyncio.to_thread(candidates, self._dir, self._pattern)
        found = []
        for entry in await self._journal.entries("staged", "ready"):
            size, unique = await asyncio.to_thread(measure, self._streamer.staging / entry.tag)
            if size == 0:  # no snapshot (yet): nothing of it to let go
                continue
            self.checkpoint_bytes = max(self.checkpoint_bytes, size)
            exists = await asyncio.to_thread(entry.source.exists)
            found.append(Pinned(entry.tag, entry.step, size, unique, exists,
                                in_flight=entry.tag == self._streamer.in_flight))
        self.trainer_keeps = retention_seen(self.trainer_keeps, len(present),
                                            any(not p.source_exists for p in found))
        going = {tag for tag, step in present.items()
                 if step in rotated_next(present.values(), self.trainer_keeps)}
        held = {p.tag for p in found} | {self._streamer.in_flight}
        freed = 0
        for tag in going - held:
            freed += (await asyncio.to_thread(measure, self._dir / tag))[1]
        return [replace(p, rotating=p.source_exists and p.tag in going) for p in found], freed


async def _logged(check: Awaitable[object]) -> None:
    """Await a space check; a failure is an error line, never the caller's failure."""
    try:
        await check
    except (OSError, TraindError) as exc:
        log.error("space_check_failed", error=str(exc))


def open_journal(state_dir: Path, run: RunIdentity) -> tuple[Journal, list[Pinned]]:
    """Open ``run``'s journal in ``state_dir``; while it cannot be for lack of space (a disk
    that filled while no daemon ran), spend the journal's reserve, then let go of the oldest
    snapshot in the run's staging whose
    source is gone, never the newest. Return the journal and what was dropped (to be
    journalled)."""
    dropped: list[Pinned] = []
    staging = staging_dir(state_dir, run)
    reserve = Reserve.in_state_dir(state_dir)
    while True:
        try:
            return Journal.in_state_dir(state_dir, run), dropped
        except JournalError as exc:
            if not exc.full:
                raise
            if reserve.release():  # the journal's own room first, then snapshots
                log.warning("journal_reserve_released", journal=str(exc.path), bytes=None,
                            free_bytes=free_bytes(state_dir),
                            hint="the disk is full; made again once it has room")
                continue
            victim = _oldest_rotated_away(staging, run.output_dir)
            if victim is None:
                raise TraindError(
                    f"the journal in {state_dir} cannot be opened: {exc} and no snapshot can "
                    "be let go; free space on that filesystem"
                ) from exc
            shutil.rmtree(staging / victim.tag, ignore_errors=True)
            log.error(
                "checkpoint_dropped", tag=victim.tag, step=victim.step, bytes=victim.bytes,
                free_bytes=free_bytes(state_dir), floor=None,
                reason="the disk is full: the journal could not be opened; the trainer had "
                       "rotated it away",
                hint="it is not stored; a newer checkpoint is kept",
            )
            dropped.append(victim)


def _oldest_rotated_away(staging: Path, output_dir: Path) -> Pinned | None:
    """The oldest snapshot in ``staging``, not the newest, whose source is gone."""
    snapshots = sorted(
        (step, path) for path in (staging.iterdir() if staging.is_dir() else ())
        if path.is_dir() and not path.name.endswith(".tmp")
        and (step := parse_step(path.name)) is not None
    )
    for step, path in snapshots[:-1]:
        if not (output_dir / path.name).exists():
            size, unique = measure(path)
            return Pinned(path.name, step, size, unique, False)
    return None

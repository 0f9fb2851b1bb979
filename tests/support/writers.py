"""Two writers, one namespace: two streamers with their own state_dir and output_dir commit
checkpoints of the same tags, with different bytes, to one store at the same time."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.checkpoints import write_checkpoint

from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.restore.download import restore
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal, JournalSession
from traind.errors import TransientStorageError
from traind.layout.manifest import Manifest, Writer
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ClaimHeldError, ConflictError
from traind.storage import LocalFile


@dataclass
class Side:
    """One writer: its directories, what it wrote, and what each commit gave it."""

    root: Path
    streamer: Streamer
    journal: Journal
    writer: Writer
    written: dict[str, dict[str, str]] = field(default_factory=dict)
    outcome: dict[str, Manifest | BaseException] = field(default_factory=dict)

    @property
    def won(self) -> list[str]:
        return sorted(t for t, o in self.outcome.items() if isinstance(o, Manifest))

    @property
    def lost(self) -> list[str]:
        return sorted(t for t, o in self.outcome.items() if isinstance(o, ConflictError))


async def side(tmp_path: Path, name: str, store: CheckpointStore, steps: int,
               size: int = 96 * 1024, claim_ttl: float = 600.0) -> Side:
    """Writer ``name`` (its own state_dir and output_dir under tmp_path/name) with
    checkpoint-1..``steps`` written (one file ``<name>-only.bin`` more), staged and ready."""
    root = tmp_path / name
    journal = Journal.in_state_dir(root / "state", RunIdentity(store.run, root / "out"))
    streamer = Streamer(store.run, root / "state", store, journal, claim_ttl=claim_ttl)
    made = Side(root, streamer, journal, await streamer.writer())
    (root / "out").mkdir(parents=True, exist_ok=True)
    for step in range(1, steps + 1):
        tag = f"checkpoint-{step}"
        made.written[tag] = write_checkpoint(root / "out", step, size=size)
        data = f"{name} {step}".encode()
        (root / "out" / tag / f"{name}-only.bin").write_bytes(data)
        made.written[tag][f"{name}-only.bin"] = hashlib.sha256(data).hexdigest()
        await streamer.stage(tag, step, root / "out" / tag)
        await journal.set_state(tag, "ready")
    return made


async def race(tmp_path: Path, stores: tuple[CheckpointStore, CheckpointStore], steps: int = 3,
               wait_held: float = 60.0) -> list[Side]:
    """Writers ``a`` and ``b`` (one store object each) commit checkpoint-1..``steps``,
    each tag by both at once; return both sides (journals closed by ``close``). A tag
    another writer's claim holds uncommitted is retried for up to ``wait_held`` seconds."""
    sides = [await side(tmp_path, name, store, steps)
             for name, store in zip("ab", stores, strict=True)]

    async def commit(who: Side, tag: str) -> None:
        held_until = time.monotonic() + wait_held
        transient = 0
        while transient < 5:  # as the streamer's loop does: a transient failure is retried
            try:
                who.outcome[tag] = await who.streamer.commit(tag)
                return
            except ClaimHeldError as exc:  # the other's upload under way: wait for it
                who.outcome[tag] = exc
                if time.monotonic() > held_until:
                    return
                await asyncio.sleep(0.1)
            except TransientStorageError as exc:
                who.outcome[tag] = exc
                transient += 1
                await asyncio.sleep(random.uniform(0.05, 0.3))
            except Exception as exc:  # recorded, asserted by the caller
                who.outcome[tag] = exc
                return

    async with asyncio.timeout(120):
        await asyncio.gather(*(commit(s, f"checkpoint-{n}")
                               for n in range(1, steps + 1) for s in sides))
    return sides


async def check_one_writer_each(sides: list[Side], store: CheckpointStore, tmp_path: Path) -> None:
    """Every tag is exactly one side's, whole: its manifest names that writer, holds that
    side's hashes and restores verified; the other side was told, journals the conflict
    and keeps its output_dir and staging snapshot."""
    a, b = sides
    tags = sorted(a.written)
    for side in sides:
        assert sorted(side.outcome) == tags
        unexpected = {t: o for t, o in side.outcome.items()
                      if not isinstance(o, Manifest | ConflictError)}
        assert not unexpected, unexpected
    assert sorted(a.won + b.won) == tags
    assert sorted(a.lost + b.lost) == tags
    by_tag = {m.tag: m for m in await store.manifests()}
    assert sorted(by_tag) == tags
    for tag in tags:
        winner, loser = (a, b) if tag in a.won else (b, a)
        manifest = by_tag[tag]
        assert manifest.writer == winner.writer
        assert {f.path: f.sha256 for f in manifest.files} == winner.written[tag]
        dest = await restore(store, manifest, tmp_path / "pulled" / tag)
        got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in dest.iterdir()}
        assert got == winner.written[tag]
        entry = await loser.journal.get(tag)
        assert entry is not None
        assert entry.state == "conflict"
        conflict = loser.outcome[tag]
        assert isinstance(conflict, ConflictError)
        assert (conflict.ours, conflict.theirs) == (str(loser.writer), str(winner.writer))
        for where in (loser.root / "out" / tag, loser.streamer.staging / tag):
            kept = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in where.iterdir()}
            assert kept == loser.written[tag], f"{where} not kept"


def close(sides: list[Side]) -> None:
    for side in sides:
        side.journal.close()


async def dead_writer(tmp_path: Path, store: CheckpointStore, tag: str = "checkpoint-1") -> Side:
    """A writer that claimed ``tag`` and uploaded every file of it, then died before its
    manifest (a preempted host): its claim is never renewed again."""
    dead = await side(tmp_path, "dead", store, steps=1)
    await store.claim(tag, dead.writer)
    await dead.journal.begin_upload(tag, store.describe)
    files = [LocalFile(f.path, f.size) for f in await dead.journal.files(tag)]
    await store.upload(tag, dead.streamer.staging / tag, files,
                       JournalSession(dead.journal, tag, lambda n: None))
    return dead


async def commit_when_stale(who: Side, tag: str, within: float = 60.0) -> Manifest:
    """Commit ``tag`` as the streamer's loop would: retried while another's claim holds it."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await who.streamer.commit(tag)
            except (ClaimHeldError, TransientStorageError):
                await asyncio.sleep(0.2)


async def check_own_bytes(who: Side, store: CheckpointStore, tag: str, tmp_path: Path) -> None:
    """``tag`` is committed by ``who``, its manifest holds ``who``'s bytes only, and a
    restore of it verifies and equals them."""
    by_tag = {m.tag: m for m in await store.manifests()}
    manifest = by_tag[tag]
    assert manifest.writer == who.writer
    assert {f.path: f.sha256 for f in manifest.files} == who.written[tag]
    dest = await restore(store, manifest, tmp_path / "pulled" / who.root.name / tag)
    got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in dest.iterdir()}
    assert got == who.written[tag]


async def race_for_stale_claim(tmp_path: Path, store: Callable[[], CheckpointStore],
                               tag: str = "checkpoint-1") -> None:
    """A writer dies mid-upload of ``tag``; two writers (each with a store of its own from
    ``store``) meet its stale claim at once: exactly one takes it over and commits its own
    bytes, the other meets that commit as a conflict."""
    dead = await dead_writer(tmp_path, store(), tag)
    sides = [await side(tmp_path, n, store(), steps=1, claim_ttl=1.0) for n in "bc"]
    await asyncio.sleep(1.2)
    try:
        outcomes = await asyncio.gather(*(commit_when_stale(s, tag) for s in sides),
                                        return_exceptions=True)
        won = [s for s, o in zip(sides, outcomes, strict=True) if isinstance(o, Manifest)]
        assert len(won) == 1, outcomes
        assert [type(o) for o in outcomes if not isinstance(o, Manifest)] == [ConflictError]
        await check_own_bytes(won[0], store(), tag, tmp_path)
    finally:
        close([dead, *sides])

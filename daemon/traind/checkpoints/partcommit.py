"""A multi-node job's checkpoints, one host's side: claim this node's part, store its part
manifest once its files are in, and commit the union once every node's part is (whichever
host's part lands last commits it)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.checkpoints.commit.lifecycle import PartsGoneError, PartsPendingError
from traind.checkpoints.state.journal import Journal
from traind.layout.manifest import Manifest, Writer
from traind.layout.parts import Incomplete, Part, PartsDisagreeError, union
from traind.protocol import CheckpointStore
from traind.protocol.ownership import ConflictError
from traind.util.nodes import NodeRank
from traind.util.retry import Backoff

log = structlog.get_logger("traind.streamer")
PARTS_BACKOFF = Backoff(0.5, 10.0)
"""How often a part stored while other hosts' parts are missing looks at them again."""


@dataclass(frozen=True)
class WaitingParts:
    """A checkpoint whose part this host stored: its step, this node's rank, and the nodes
    whose parts are in the store or missing, as last seen."""

    step: int
    node_rank: int
    present: tuple[int, ...]
    missing: tuple[int, ...]


class PartCommitter:
    """Node ``node``'s parts of the job's checkpoints in ``store()``, journalled in
    ``journal``, snapshot under ``staging``."""

    def __init__(self, node: NodeRank, store: Callable[[], CheckpointStore], journal: Journal,
                 staging: Path) -> None:
        self._node = node
        self._store = store
        self._journal = journal
        self._staging = staging
        self._waits: dict[str, int] = {}
        """Tags whose part is stored, with how often their parts were looked at since."""
        self.waiting: dict[str, WaitingParts] = {}
        """Tags whose part this host stored, while other nodes' parts are missing."""

    async def committed_since(self, tag: str) -> Manifest | None:
        """The union of ``tag`` when another host committed it while this one waited (one
        small read); PartsGoneError when this host's part, claimed and sent before, is gone
        from the store since; None when this part is still to send or to commit."""
        store = self._store()
        if tag in self._waits and (found := await store.committed(tag)) is not None:
            if not {(f.path, f.size) for f in await self._journal.files(tag)} <= {
                    (f.path, f.size) for f in found.files}:
                raise PartsDisagreeError(f"{tag}: committed without this host's files")
            return found
        if ((tag in self._waits or any(f.sha256 for f in await self._journal.files(tag)))
                and await store.part_claim(tag, self._node.rank) is None):
            raise PartsGoneError(tag)
        return None

    async def claim(self, tag: str, ours: Writer) -> None:
        """Take this node's part of ``tag``: this node's for good, never renewed nor taken
        over, so a re-check of a stored part claims nothing (a claim made again while node 0
        prunes the checkpoint would be left behind)."""
        if tag not in self._waits:
            await self._store().claim_part(tag, self._node.rank, ours)

    async def commit(self, mine: Manifest, ours: Writer) -> Manifest:
        """Store this host's part of ``mine.tag``, then commit the union when every part is
        in (the others' commits find the same files committed); raise PartsPendingError
        while some are missing."""
        store = self._store()
        if mine.tag not in self._waits:  # a re-check leaves it: its created_at is its age
            await store.commit_part(Part(mine.run, mine.tag, mine.step, self._node.rank,
                                         self._node.nodes, ours, mine.files, mine.trainer))
        ranks = await store.part_ranks(mine.tag)
        if mine.tag in self._waits and self._node.rank not in ranks:
            raise PartsGoneError(mine.tag)  # stored before, deleted since (pruned, given up)
        decision: Manifest | Incomplete
        if missing := tuple(r for r in range(self._node.nodes) if r not in ranks):
            decision = Incomplete(tuple(sorted(ranks)), missing)
        else:  # ours completed the set: read them all and commit the union
            decision = union(mine.tag, await store.parts(mine.tag), self._node.nodes, ours)
        if isinstance(decision, Incomplete):
            self.waiting[mine.tag] = WaitingParts(mine.step, self._node.rank,
                                                  decision.present, decision.missing)
            if mine.tag not in self._waits:  # said once; the re-checks read the manifest
                self._waits[mine.tag] = 0
                log.info("checkpoint_part_stored", tag=mine.tag, step=mine.step,
                         node_rank=self._node.rank, files=len(mine.files),
                         present=list(decision.present), missing=list(decision.missing))
            raise PartsPendingError(mine.tag, decision)
        try:
            await store.commit_union(decision)
        except ConflictError as exc:  # another host's commit of the same union came first
            if exc.committed is None or exc.committed.files != decision.files:
                raise
            decision = exc.committed
        return decision

    def wait(self, tag: str) -> float:
        """Seconds until ``tag``'s parts are looked at again: the other hosts' are still
        coming."""
        n = self._waits[tag] = self._waits.get(tag, 0) + 1
        return PARTS_BACKOFF.delay(n - 1)

    def forget(self, tag: str) -> None:
        """``tag`` is committed, let go or given up: nothing of it waits any more."""
        self._waits.pop(tag, None)
        self.waiting.pop(tag, None)

    async def disagree(self, tag: str, exc: PartsDisagreeError) -> None:
        """The hosts' parts of ``tag`` cannot make one checkpoint: stop for good, loudly,
        and keep the local copy."""
        self.forget(tag)
        await self._journal.set_state(tag, "conflict")
        log.error("checkpoint_parts_disagree", tag=tag, error=str(exc),
                  backend=self._store().describe, kept=str(self._staging / tag),
                  hint="the hosts of the job saved different bytes under one path (or "
                       "different steps under one tag); this checkpoint is never committed")

    async def gone(self, tag: str) -> None:
        """Our part of ``tag`` was stored, and the checkpoint deleted from the store since:
        committed while this host waited and pruned by node 0, or given up by node 0 when
        another host's part never came (``run.part_timeout``). Claiming it again would
        leave an orphan part behind."""
        self.forget(tag)
        await self._journal.set_state(tag, "pruned")
        await asyncio.to_thread(shutil.rmtree, self._staging / tag, True)
        log.info("checkpoint_pruned_while_waiting", tag=tag, backend=self._store().describe,
                 reason="this host's part is gone from the store: the checkpoint was "
                        "committed and pruned before this host looked again, or node 0 "
                        "gave it up as abandoned (checkpoint_parts_abandoned)")

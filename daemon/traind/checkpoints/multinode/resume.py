"""The resume point of one host of a multi-node job: its side of the agreement (see
agreement.py), then the agreed checkpoint made whole in output_dir.

Before asking, a host lets its own streamer store its part of every complete checkpoint, so
the checkpoints every host saved are committed by the time all requests are in. The wait
for the others ends only with the decision or with cancellation (the daemon stopping): a
trainer of the job cannot run without every host anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from traind.checkpoints.multinode.agreement import (
    Board,
    Committed,
    ResumeDecision,
    covers,
    decide,
    tally,
)
from traind.checkpoints.multinode.assemble import make_whole
from traind.checkpoints.state.journal import Journal
from traind.errors import IntegrityError, StorageError, TraindError
from traind.protocol import CheckpointStore
from traind.util.fileio import write_atomic
from traind.util.nodes import NodeRank
from traind.util.poll import poll_until
from traind.util.proc.child import uninterrupted
from traind.util.retry import Backoff, retrying

log = structlog.get_logger("traind.joint")

T = TypeVar("T")
POLL = Backoff(0.25, 2.0)
"""The pause between polls of the store while waiting."""
SETTLE_LIMIT = 300.0
"""Seconds a host waits at most for its own parts to be stored before it asks."""
WITHDRAW_TIMEOUT = 5.0
"""Seconds a stopping host spends removing its start request."""


@dataclass(frozen=True)
class Waiting:
    """This host waits for the resume point since ``since`` (Unix time); ``missing`` are
    the ranks without a request as node 0 last counted, None before it counted ours."""

    node_rank: int
    nonce: str
    since: float
    missing: tuple[int, ...] | None


class JointResume:
    """Agrees with the other hosts on the checkpoint every trainer resumes from, and makes
    it whole in ``output_dir`` before this host's trainer starts."""

    def __init__(self, node: NodeRank, settled: Callable[[], bool],
                 scan: Callable[[], Awaitable[object]], ticket: Path | None = None,
                 poll: Backoff = POLL) -> None:
        self._node = node
        self._ticket = ticket
        """Where this host keeps its last request's nonce and whether a trainer start used
        its answer (state_dir): a daemon killed while it waited asks with the same nonce,
        so a decision node 0 made for it meanwhile is this host's too."""
        self._settled = settled
        """Whether this host's streamer has stored its part of every complete checkpoint."""
        self._scan = scan
        """Hands on every checkpoint the trainer, stopped or not yet started, left complete
        (the watcher's last scan), without waiting for ``settle``."""
        self._poll = poll
        self._board: Board | None = None
        """Node 0's last board, as written (read from the store on its first poll)."""
        self._read = False
        self._reported = False
        self.waiting: Waiting | None = None
        """While this host waits for the others: what it waits for (``traind status``)."""

    async def resume_point(
        self, storage: CheckpointStore, journal: Journal, output_dir: Path,
        restoring: Callable[[str], None],
    ) -> Path | None:
        """The agreed checkpoint as a whole local directory, or None (from scratch).
        ``restoring`` is told a tag this host's journal does not know before its files
        land in ``output_dir`` (the watcher must not take them for a new save). A fetch
        that fails is retried on the next start with the same decision: the other hosts'
        trainers started from it."""
        await self._settle()
        decision = await self.agree(storage)
        if decision.tag is None:
            await self._answered(decision)
            return None
        manifest = await storage.committed(decision.tag)
        if manifest is None:
            await self._answered(decision)
            raise TraindError(f"{decision.tag}, the agreed resume point, is no longer in "
                              f"{storage.describe}; asking again")
        entry = await journal.get(manifest.tag)
        if entry is None:
            restoring(manifest.tag)
        path, fetched = await make_whole(storage, manifest, output_dir)
        if entry is None or (fetched and entry.state not in ("staged", "ready", "conflict")):
            await journal.record_committed(manifest.tag, manifest.step, path, storage.describe)
        await self._answered(decision)
        return path

    async def _settle(self) -> None:
        """Hand on what the trainer left complete (``scan``), then wait (at most
        SETTLE_LIMIT) until every checkpoint this host still has to commit has its part
        stored."""
        await self._scan()

        async def settled() -> bool:
            return self._settled()

        if not await poll_until(settled, within=SETTLE_LIMIT, every=self._poll):
            log.warning("resume_request_unsettled", node_rank=self._node.rank,
                        waited=SETTLE_LIMIT,
                        hint="asking for the resume point although this host's parts "
                             "of these checkpoints are not stored")

    async def agree(self, storage: CheckpointStore) -> ResumeDecision:
        """Store a start request in ``storage`` and wait until a decision covers it; on
        cancellation the request is withdrawn. The nonce is fresh, unless this host's last
        request was never used for a start (its daemon stopped while it waited)."""
        store = storage
        rank = self._node.rank
        nonce = await asyncio.to_thread(_unanswered, self._ticket) or uuid.uuid4().hex
        await asyncio.to_thread(_keep, self._ticket, nonce, False)
        started = time.monotonic()
        self._reported = False

        async def answer() -> ResumeDecision | None:
            return covers(await self._retrying(lambda: self._board_now(store)), rank, nonce)

        try:  # a request being written when cancelled is written whole, then withdrawn
            await self._retrying(lambda: uninterrupted(store.request_start(rank, nonce)))
            self.waiting = Waiting(rank, nonce, time.time(), None)
            decision = await poll_until(answer, within=None, every=self._poll)
        except BaseException:
            with contextlib.suppress(TraindError, TimeoutError):
                async with asyncio.timeout(WITHDRAW_TIMEOUT):
                    await asyncio.shield(store.withdraw_start(rank, nonce))
            raise
        finally:
            self.waiting = None
        assert decision is not None  # without a deadline only a decision ends the poll
        log.info("resume_point_agreed", node_rank=rank, tag=decision.tag, step=decision.step,
                 round=decision.round, nodes=len(decision.nonces),
                 waited=round(time.monotonic() - started, 3))
        return decision

    async def _answered(self, decision: ResumeDecision) -> None:
        """This host's trainer starts on ``decision``: its next start asks anew."""
        await asyncio.to_thread(_keep, self._ticket, decision.nonces[self._node.rank], True)

    async def _board_now(self, store: CheckpointStore) -> Board | None:
        """The board as this host's poll sees it: node 0 counts the requests and writes a
        changed board; the others read it. The wait is logged whenever what it waits for
        changes."""
        board = await (self._count(store) if self._node.rank == 0
                       else self._fetch(store))
        waiting = self.waiting
        if waiting is None or covers(board, waiting.node_rank, waiting.nonce) is not None:
            return board
        counted = board is not None and board.seen.get(waiting.node_rank) == waiting.nonce
        missing = board.missing if board is not None and counted else None
        if missing != waiting.missing or not self._reported:
            self._reported = True
            self.waiting = Waiting(waiting.node_rank, waiting.nonce, waiting.since, missing)
            log.info("waiting_for_resume_point", node_rank=waiting.node_rank,
                     nodes=self._node.nodes, missing=None if missing is None else list(missing))
        return board

    @staticmethod
    async def _fetch(store: CheckpointStore) -> Board | None:
        data = await store.read_board()
        return None if data is None else Board.from_json(data)

    async def _count(self, store: CheckpointStore) -> Board:
        """Node 0's poll: one listing of the requests; a decision when none is missing."""
        if not self._read:
            try:
                self._board = await self._fetch(store)
            except IntegrityError as exc:  # rewritten whole by the next decision
                log.error("resume_board_unreadable", error=str(exc))
            self._read = True
        board = tally(self._node.nodes, self._board, await store.start_requests())
        if not board.missing:
            manifests = await store.manifests()
            board = decide(board, [Committed(m.tag, m.step, m.created_at) for m in manifests],
                           time.time())
        if board != self._board:
            await store.write_board(board.to_json())
            self._board = board
        return board

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` until the store answers; every failure is logged, then retried."""

        def logged(exc: BaseException, _: int, pause: float) -> None:
            log.error("resume_point_poll_failed", node_rank=self._node.rank, error=str(exc),
                      retry_in=pause)

        return await retrying(call, self._poll, None, _store_failed, logged)


def _store_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing or answering garbage: the wait goes on."""
    return isinstance(exc, StorageError | IntegrityError)


def _unanswered(ticket: Path | None) -> str | None:
    """The nonce of this host's last request when no trainer start used its answer; one
    that is not letters and digits (an edited file) is not reused: S3 keys carry it."""
    try:
        raw = json.loads(ticket.read_bytes()) if ticket is not None else None
    except (OSError, ValueError):
        return None
    nonce = raw.get("nonce") if isinstance(raw, dict) and not raw.get("answered") else None
    if isinstance(nonce, str) and nonce.isascii() and nonce.isalnum():
        return nonce
    return None


def _keep(ticket: Path | None, nonce: str, answered: bool) -> None:
    """Record this host's request ``nonce`` in ``ticket``, atomically."""
    if ticket is None:
        return
    write_atomic(ticket, json.dumps({"nonce": nonce, "answered": answered}).encode())

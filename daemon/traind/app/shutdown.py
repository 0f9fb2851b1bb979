"""The daemon's ordered shutdown, and how a run whose trainer ended comes to its stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from traind.app.observe import Observer
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import Watcher
from traind.config import Settings
from traind.supervisor.supervisor import Supervisor
from traind.util.proc.child import uninterrupted

log = structlog.get_logger("traind.app")

RELEASE_TIMEOUT = 5.0
"""Seconds a stopping daemon spends marking its claims on unstored checkpoints stale."""


@dataclass(frozen=True)
class Running:
    """The main loop's tasks, in the order ``shut_down`` stops them."""

    background: list[asyncio.Task[None]]
    watching: asyncio.Task[None]
    stop_watching: asyncio.Event
    streaming: asyncio.Task[None]


async def shut_down(running: Running, watcher: Watcher, streamer: Streamer,
                    supervisor: Supervisor | None, observer: Observer,
                    settings: Settings) -> list[str]:
    """Stop in order: the children (trainer first), then, within ``stop_timeout``, a last
    scan that hands on every checkpoint the stopped trainer left complete, committed newest
    first. Without a trainer of its own the writer may still be saving: the watcher runs on
    until every candidate has settled (or the budget is spent) before that scan. Returns what
    is not committed by then (it is in the journal for next time); its claims are released
    once the streamer stopped."""
    log.info("daemon_stopping")
    observer.notifier.stopping()
    observer.set_state("stopping")
    if supervisor is not None:
        await supervisor.stop()
    for task in running.background:
        task.cancel()
    writer_gone = supervisor is not None and supervisor.trainer is not None
    streamer.prefer_newest()
    deadline = asyncio.get_running_loop().time() + settings.run.stop_timeout
    if not writer_gone:
        await settle_at_stop(watcher, deadline, settings.checkpoints.settle)
    running.stop_watching.set()
    left: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline):
            await running.watching
            left = await watcher.final_scan(writer_gone)
            await streamer.wait_idle()
    running.streaming.cancel()
    left = list(dict.fromkeys([*left, *watcher.unsettled()]))
    unstored = [*streamer.unstored, *(t for t in left if t not in streamer.unstored)]
    if unstored:  # the next host takes them over without waiting claim_ttl
        await asyncio.wait([running.streaming])  # its upload (and renewals) stopped first
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await streamer.release(unstored)
    return unstored


async def settle_at_stop(watcher: Watcher, deadline: float, settle: float) -> None:
    """Keep watching until no candidate waits to settle, or until ``deadline``: the writer
    is not this daemon's child, so only its quiet says a save is done."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline):
            await watcher.scan()  # a save that ended just now is a candidate too
            if not (waiting := watcher.unsettled()):
                return
            log.info("checkpoints_settling_at_stop", checkpoints=waiting, settle=settle,
                     budget=round(deadline - started, 3),
                     reason="no [trainer]: its writer may still be saving; each is "
                            "complete once quiet for settle")
            await watcher.settled()
    left = watcher.unsettled()
    (log.warning if left else log.info)(
        "checkpoints_settled_at_stop", waited=round(loop.time() - started, 3),
        unsettled=list(left),
    )


async def supervise(supervisor: Supervisor, settings: Settings, watcher: Watcher,
                    streamer: Streamer, stop: asyncio.Event,
                    failed: Callable[[int | None], None]) -> None:
    """Run the children; when training finished, commit what is left, then set ``stop``.
    When it failed for good, so too under ``exit_when_failed``: ``failed`` hears the
    trainer's exit status first, for ``traind run`` to exit with."""
    outcome = await supervisor.run()
    trainer = settings.trainer
    exits = trainer is not None and (
        trainer.exit_when_done if outcome == "finished" else trainer.exit_when_failed)
    if outcome != "finished":
        log.error(
            "supervision_ended",
            outcome=outcome,
            hint="traind exits once every checkpoint is committed" if exits else
                 "checkpoint streaming continues; see the child_* events",
        )
        if not exits:
            return
        failed(supervisor.failure_status())
    # The trainer is gone: every marked checkpoint it left is complete now, settled or not.
    # The scan is not cut short by a stop (no snapshot is left half taken).
    await uninterrupted(watcher.final_scan(writer_gone=True))
    if streamer.pending:
        log.info("run_waiting_for_uploads", checkpoints=streamer.pending,
                 hint="the daemon exits once every checkpoint is committed")
    await streamer.wait_idle()
    if outcome == "finished":
        log.info("run_complete", exit=exits)
    if exits:
        stop.set()

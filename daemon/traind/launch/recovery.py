"""A run that outlives its jobs and hosts: when the job (or rented host) running ``traind run``
ends before the trainer finished, start the next one with the same spec; its ``traind run``
restores the newest committed checkpoint from the store and trains on.

``decide`` is the pure decision (recover or stop, and why), and ``unreachable_verdict`` the
one on a host whose SSH stopped answering (a blip, gone, or dead past ``[host]
unreachable_after`` while its provider still lists it); ``follow_recovering`` is the one
loop both launch flows share, with the backend-specific "wait for this one's end", "end it"
and "start the next" passed in. The launch's record holds the history, so ``launch status``
shows it, and a ``launch down`` from another shell (which marks the record stopping, then
removes it) stops the loop.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from traind.launch.errors import LaunchError
from traind.launch.handles import LaunchRecord, LaunchStore
from traind.util.proc.child import uninterrupted

log = structlog.get_logger("traind.launch")
FINISHED_EVENTS = frozenset({"run_complete"})
"""traind's events saying its run is complete (the trainer finished, all committed)."""
_STEP = re.compile(r"\bstep=(\d+)\b")


@dataclass(frozen=True)
class Ending:
    """How one job or host ended, as its follower saw it. ``state`` is "finished" when the
    trainer exited 0, "detached" when the user stopped following, else the platform's state
    (timeout, error, cancelled, gone, ...) in ``message``'s words."""

    state: str
    message: str = ""
    ended_at: float = 0.0
    reached_step: int | None = None
    checkpoint: str | None = None
    checkpoint_step: int | None = None


@dataclass(frozen=True)
class Decision:
    """Recover (start the next job/host) or stop, and why."""

    recover: bool
    reason: str


def decide(ending: Ending, recoveries: int, max_recoveries: int, taken_down: bool) -> Decision:
    """Whether to start the next job/host after ``ending``, ``recoveries`` done so far."""
    if ending.state in ("finished", "detached"):
        return Decision(False, ending.state)
    if taken_down:
        return Decision(False, "taken down")
    if recoveries >= max_recoveries:
        return Decision(False, f"ended {ending.state} after {recoveries} recoveries "
                               f"(max_recoveries = {max_recoveries})")
    return Decision(True, f"ended {ending.state}: {ending.message or 'no reason given'}")


def unreachable_verdict(
    listed_ended: bool, answers: bool, unreachable_for: float, bound: float
) -> str:
    """At one look at a followed host whose SSH stopped answering ``unreachable_for`` seconds
    ago: "gone" when its provider lists it stopped or destroyed, "back" when it answers again
    (a blip: nothing to do), "dead" when it has not answered for longer than ``bound`` seconds
    while its provider still lists it (and bills it), else "waiting"."""
    if listed_ended:
        return "gone"
    if answers:
        return "back"
    return "dead" if unreachable_for > bound else "waiting"


def steps_lost(ending: Ending) -> int | None:
    """Trainer steps reached before the end minus the restored checkpoint's, when both known."""
    if ending.reached_step is None:
        return None
    return max(0, ending.reached_step - (ending.checkpoint_step or 0))


class Progress:
    """What the log lines of one job/host say: the step reached, the newest commit, and
    whether traind said its run is complete (``run_complete``)."""

    def __init__(self) -> None:
        self.reached_step: int | None = None
        self.checkpoint: str | None = None
        self.checkpoint_step: int | None = None
        self.run_complete = False

    def see(self, line: str) -> None:
        """Take in one log line (traind's JSON, or the trainer's ``step=N`` text)."""
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            if event.get("event") == "checkpoint_committed" and isinstance(event.get("step"), int):
                self.checkpoint, self.checkpoint_step = str(event.get("tag")), event["step"]
            self.run_complete = self.run_complete or event.get("event") in FINISHED_EVENTS
            text = str(event.get("line") or event.get("message") or "")
        else:
            text = line
        if match := _STEP.search(text):
            self.reached_step = max(self.reached_step or 0, int(match.group(1)))

    def ending(self, state: str, message: str) -> Ending:
        """The ending of this job/host, now."""
        return Ending(state, message, time.time(), self.reached_step, self.checkpoint,
                      self.checkpoint_step)

    def job_ending(self, completed: bool, state: str, message: str) -> Ending:
        """The ending of a job the platform reports ``state`` (``completed``: it exited 0).
        Exiting 0 is "finished" only after ``run_complete``: traind stopped by SIGTERM or
        SIGINT (a ``docker stop``, a host shutting down) commits the newest checkpoint and
        exits 0 too, its trainer unfinished."""
        if not completed:
            return self.ending(state, message)
        if self.run_complete:
            return self.ending("finished", message)
        return self.ending("stopped", "exited 0 before traind's run_complete: traind was "
                                      "stopped before its trainer finished"
                                      + (f" ({message})" if message else ""))


WaitEnd = Callable[[LaunchRecord], Awaitable[Ending]]
End = Callable[[LaunchRecord], Coroutine[Any, Any, None]]
Start = Callable[[LaunchRecord], Awaitable[LaunchRecord]]


async def follow_recovering(
    store: LaunchStore, record: LaunchRecord, max_recoveries: int, wait_end: WaitEnd,
    end: End, start: Start,
) -> str:
    """Follow ``record`` until its trainer finishes, recovering up to ``max_recoveries`` times:
    "finished", "detached", "taken down", or raise LaunchError (when the recoveries ran out,
    or a step failed) with the launch's job/host ended. ``end`` ends a job/host and confirms
    nothing of it is left billed; ``start`` starts and saves the next one like it."""
    try:
        return await _recovering(store, record, max_recoveries, wait_end, end, start)
    except LaunchError:
        if store.exists(record.name):
            await uninterrupted(end(store.load(record.name)))
        raise


async def _recovering(
    store: LaunchStore, record: LaunchRecord, max_recoveries: int, wait_end: WaitEnd,
    end: End, start: Start,
) -> str:
    recoveries = len(record.recoveries)
    while True:
        ending = await wait_end(record)
        decision = decide(ending, recoveries, max_recoveries, not store.live(record.name))
        if not decision.recover:
            if ending.state in ("finished", "detached") or decision.reason == "taken down":
                return decision.reason
            raise LaunchError(f"launch {record.name}: the job {decision.reason}; the newest "
                              f"committed checkpoint is {ending.checkpoint or 'none'}")
        log.warning("launch_recovering", launch=record.name, instance=record.handle.instance_id,
                    state=ending.state, message=ending.message, recovery=recoveries + 1)
        await end(record)
        if not store.live(record.name):  # taken down meanwhile: start nothing
            return "taken down"
        new = await start(record)
        recoveries += 1
        entry = {
            "at": time.time(), "state": ending.state, "message": ending.message,
            "from_instance": record.handle.instance_id, "to_instance": new.handle.instance_id,
            "checkpoint": ending.checkpoint, "steps_lost": steps_lost(ending),
            "seconds": round(time.time() - (ending.ended_at or time.time()), 3),
        }
        record = store.save(new.with_(recoveries=(*record.recoveries, entry)))
        log.info("launch_recovered", launch=record.name, recovery=recoveries, **entry)

"""What a killed daemon left running, stopped before a new one starts its children.

Children run in sessions of their own, so a daemon killed by SIGKILL (OOM killer, ``kill -9``)
leaves them running; restarted, it would start a second trainer writing the same checkpoints.
At start-up, processes whose environment names this daemon's state_dir (``OWNER_TAG``, set on
every child and inherited by their descendants) are stopped as a child is: SIGTERM, grace,
SIGKILL. Processes of other state_dirs, and this process, are never touched.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.config import ChildConfig
from traind.supervisor.env import CHILD_TAG, OWNER_TAG, owner_of, tag_name
from traind.supervisor.process import KILL_WAIT
from traind.supervisor.procfs import Proc, descendants, environ, process_table, send
from traind.util.poll import poll_until
from traind.util.proc.child import uninterrupted

log = structlog.get_logger("traind.supervisor")

DEFAULT_GRACE = 5.0
"""SIGTERM grace when this run configures no child (and so no ``stop_grace``)."""
POLL = 0.1


@dataclass(frozen=True)
class Leftover:
    """A process a previous daemon left running, and the child it belongs to when its
    environment says."""

    proc: Proc
    child: str | None

    @property
    def key(self) -> tuple[int, int]:
        """Pid and start time: one process, even once its pid is reused."""
        return self.proc.pid, self.proc.start


def find(owner: str) -> list[Leftover]:
    """Live processes whose environment names ``owner``, the members of process groups they
    lead and their descendants; never this process. Blocking: reads every environment."""
    table = process_table()
    entry = f"{OWNER_TAG}={owner}".encode()
    marked = {pid: _child(env) for pid in table if entry in (env := environ(pid))}
    leaders = {pid for pid in marked if table[pid].pgrp == pid}
    pids = set(marked) | descendants(table, *marked)
    pids.update(p.pid for p in table.values() if p.pgrp in leaders)
    pids -= {os.getpid(), 1}
    return [Leftover(table[pid], marked.get(pid)) for pid in sorted(pids)
            if table[pid].state != "Z"]


def _child(env: list[bytes]) -> str | None:
    prefix = f"{CHILD_TAG}=".encode()
    tag = next((e.removeprefix(prefix) for e in env if e.startswith(prefix)), None)
    return None if tag is None else tag_name(tag.decode(errors="replace"))


async def stop_leftovers(state_dir: Path, children: Iterable[ChildConfig | None]) -> None:
    """Stop every process a previous daemon of ``state_dir`` left running and wait until they
    are gone: SIGTERM, up to the longest ``stop_grace`` of this run's ``children``, SIGKILL.

    One event per leftover (``orphan_stopped``, or why it could not be); none when there are
    none. Cancelling skips the rest of the grace period, never the kill and wait.
    """
    grace = max((c.stop_grace for c in children if c is not None), default=DEFAULT_GRACE)
    sweep = _Sweep(owner_of(state_dir))
    try:
        await sweep.until_gone(signal.SIGTERM, grace)
    finally:
        left = await uninterrupted(sweep.until_gone(signal.SIGKILL, KILL_WAIT))
    for o in left:
        log.error("orphan_unkillable", pid=o.proc.pid, child=o.child, waited=KILL_WAIT)


class _Sweep:
    """The leftovers of one owner being stopped: what each was sent, reported once it is gone."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._sent: dict[tuple[int, int], tuple[Leftover, signal.Signals]] = {}
        self._refused: set[tuple[int, int]] = set()

    async def until_gone(self, sig: signal.Signals, within: float) -> list[Leftover]:
        """Send ``sig`` to every leftover (found again each poll, so late forks too) until none
        is left or ``within`` seconds passed; return those left, less any we may not signal."""

        async def sweep() -> list[Leftover]:
            left = self._update(await asyncio.to_thread(find, self._owner))
            for o in left:
                self._send(o, sig)
            return left

        return await poll_until(sweep, done=lambda left: not left, within=within, every=POLL)

    def _update(self, found: list[Leftover]) -> list[Leftover]:
        alive = {o.key for o in found}
        for key in [k for k in self._sent if k not in alive]:
            o, sig = self._sent.pop(key)
            log.warning("orphan_stopped", pid=o.proc.pid, child=o.child, signal=sig.name)
        return [o for o in found if o.key not in self._refused]

    def _send(self, o: Leftover, sig: signal.Signals) -> None:
        sent = self._sent.get(o.key)
        if sent is not None and sent[1] is sig:
            return
        try:
            send(o.proc, sig)
        except PermissionError as exc:
            self._refused.add(o.key)
            log.error("orphan_unstoppable", pid=o.proc.pid, child=o.child, signal=sig.name,
                      error=str(exc))
            return
        self._sent[o.key] = (o, sig)

"""Reaping what traind adopts as PID 1 (a container's entrypoint) or as a subreaper: the
orphans of its children's children, which no one else will ever wait for.

asyncio waits for every process traind spawns the moment it exits, so a child of traind
that is still a zombie a whole sweep later is one it adopted; only those are waited for
here, which keeps a child's exit status for the code that spawned it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from traind.supervisor.procfs import read_proc

log = structlog.get_logger("traind.supervisor")

REAP_INTERVAL = 1.0
"""Seconds between sweeps: how long an adopted zombie may last."""


def zombie_children() -> set[int]:
    """The pids of this process's children that are zombies (``/proc/self/task/*/children``)."""
    me = os.getpid()
    pids: set[int] = set()
    for task in os.scandir(f"/proc/{me}/task"):
        try:
            pids.update(int(pid) for pid in Path(task.path, "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    found = (read_proc(pid) for pid in pids)
    return {p.pid for p in found if p is not None and p.state == "Z" and p.ppid == me}


class Reaper:
    """Waits for the zombie children that were zombies at the previous sweep too."""

    def __init__(self) -> None:
        self._zombies: set[int] = set()

    def sweep(self) -> dict[int, int]:
        """Reap the adopted zombies; return pid → exit status (negative: the signal).

        Blocking (reads /proc)."""
        now = zombie_children()
        reaped: dict[int, int] = {}
        for pid in sorted(now & self._zombies):
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by its spawner after all
                continue
            if got:
                reaped[pid] = os.waitstatus_to_exitcode(status)
        self._zombies = now - reaped.keys()
        return reaped


async def reap_forever() -> None:
    """Wait for the orphans this process adopted, as PID 1 or subreaper, once they exit:
    nothing else would, and each would stay a zombie."""
    reaper = Reaper()
    while True:
        await asyncio.sleep(REAP_INTERVAL)
        for pid, code in (await asyncio.to_thread(reaper.sweep)).items():
            log.info("orphan_reaped", pid=pid, returncode=code)

"""Checkpoint transfers below the trainer on the CPU.

Linux ranks work at two levels. Within a group, by each thread's nice value: a thread's own,
which a process forked from it starts at. Between groups, by the group's: a cgroup's weight
or, for processes in the root cpu cgroup (a host without systemd's CPU accounting, most VMs),
the autogroup of their session, whose nice value is its own (``/proc/<pid>/autogroup``). The
trainer and vLLM run in sessions of their own (``child``), so they are in groups of their own
where autogroups are in use.

So traind lowers its transfers at both levels: the threads that hash, copy and send
checkpoints, and the ssh and rsync it starts (their sessions' autogroups too); and, when it
leads its session (as a systemd service does), its own autogroup, which is then traind alone:
its event loop's thread keeps the daemon's nice value within it.
The trainer and vLLM keep the daemon's priority. A unit's ``Nice=`` cannot do this: it lowers
the whole service, the trainer included.

``lower_transfers`` and ``lower_session`` are called once, by ``traind run``; until then
(every other command, and every test that does not ask) nothing here changes a priority.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from traind.util.retry import Backoff, retrying

MAX_NICE = 19
AUTOGROUP_RETRY = Backoff(0.1, 0.2, jitter=0.5)
"""The kernel allows one autogroup change in 0.1 s host-wide without CAP_SYS_ADMIN."""

_nice: int | None = None
"""The nice value of transfer work, once ``lower_transfers`` set one."""


def per_thread() -> bool:
    """Whether this system gives each thread a nice value of its own (Linux); elsewhere
    lowering a thread would lower the whole process, the trainer it starts included."""
    return sys.platform == "linux"


def lower_transfers(by: int) -> int | None:
    """From now on run transfer threads (``executor``) and processes (``lower_group``)
    ``by`` nice levels below the calling thread; return their nice value, or None when
    nothing is lowered (``by`` is 0, or ``per_thread`` is false)."""
    global _nice
    if by <= 0 or not per_thread():
        _nice = None
        return None
    _nice = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, 0) + by)
    return _nice


async def lower_session() -> bool:
    """Lower this process's autogroup to the transfer nice value if it leads its session
    (then the autogroup is this process alone: its children start sessions of their own);
    whether it did. Called once, at the daemon's start."""
    if _nice is None or os.getsid(0) != os.getpid():
        return False
    return await _lower_autogroup(os.getpid(), _nice)


def transfer_nice() -> int | None:
    """The nice value transfer work runs at, or None if it runs at the daemon's."""
    return _nice


def lower_this_thread() -> None:
    """Lower the calling thread to the transfer nice value (as a pool's initializer)."""
    if _nice is not None:
        with contextlib.suppress(OSError):  # a thread is never refused a higher nice value
            os.setpriority(os.PRIO_PROCESS, 0, max(_nice, os.getpriority(os.PRIO_PROCESS, 0)))


async def lower_group(pgid: int) -> None:
    """Lower a transfer child that leads a session of its own (ssh, rsync: ``child``), the
    group ``pgid`` and its autogroup, to the transfer nice value; its children inherit it."""
    if _nice is None:
        return
    with contextlib.suppress(OSError):  # already gone
        os.setpriority(os.PRIO_PGRP, pgid, _nice)
    await _lower_autogroup(pgid, _nice)


async def _lower_autogroup(pid: int, nice: int) -> bool:
    """Set the nice value of ``pid``'s autogroup; whether it was set. EAGAIN (another change
    too recently, anywhere on the host) is retried; ENOENT (no autogroups in this kernel, or
    ``pid`` gone) and the rest are given up."""

    async def attempt() -> None:
        _write_autogroup(pid, nice)  # procfs, no disk behind it: answered at once

    try:
        await retrying(attempt, AUTOGROUP_RETRY, 2,
                       lambda exc: isinstance(exc, OSError) and exc.errno == errno.EAGAIN)
    except OSError:
        return False
    return True


def _write_autogroup(pid: int, nice: int) -> None:
    with open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))


def executor(workers: int | None = None, name: str = "traind-transfer") -> ThreadPoolExecutor:
    """A thread pool whose threads run at the transfer nice value (as asyncio's default
    executor, ``workers`` defaults to min(32, CPUs + 4))."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=lower_this_thread)

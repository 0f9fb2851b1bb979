"""Who belongs to a child, as /proc shows it: its process group, its descendants and whatever
carries its tag; and the subreaper flag that keeps orphaned grandchildren findable.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from traind.supervisor.env import CHILD_TAG
from traind.util.proc.child import signal_group

log = structlog.get_logger("traind.supervisor")
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Proc:
    """One /proc entry; ``start`` (clock ticks after boot) tells a reused pid apart."""

    pid: int
    ppid: int
    pgrp: int
    start: int
    state: str


def read_proc(pid: int) -> Proc | None:
    """``/proc/<pid>/stat`` parsed, or None when the process is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    f = data[data.rindex(b")") + 2 :].split()  # the name in parentheses may hold spaces
    return Proc(pid, int(f[1]), int(f[2]), int(f[19]), f[0].decode())


def process_table() -> dict[int, Proc]:
    """Every process visible in /proc."""
    found = (read_proc(int(e.name)) for e in os.scandir("/proc") if e.name.isdigit())
    return {p.pid: p for p in found if p is not None}


def descendants(table: Mapping[int, Proc], *roots: int) -> set[int]:
    """Pids below any of ``roots`` in the parent tree of ``table``."""
    children: dict[int, list[int]] = defaultdict(list)
    for p in table.values():
        children[p.ppid].append(p.pid)
    found: set[int] = set()
    todo = [pid for root in roots for pid in children[root]]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children[pid])
    return found


def environ(pid: int) -> list[bytes]:
    """``/proc/<pid>/environ`` as ``NAME=value`` entries; empty when the process is gone or
    not ours to read."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def send(p: Proc, sig: int) -> None:
    """Send ``sig`` to ``p`` unless it is gone, a zombie, or its pid now names another process.
    PermissionError propagates."""
    now = read_proc(p.pid)
    if now is not None and now.start == p.start and now.state != "Z":
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)


class ProcessTree:
    """What a child started, as far as /proc shows: its process group, its descendants
    (remembered after they are reparented to us or init), and whatever carries its tag."""

    def __init__(self, leader: int, tag: str) -> None:
        self.leader = leader
        self._entry = f"{CHILD_TAG}={tag}".encode()
        self._seen: dict[int, int] = {}

    def scan(self, *, by_tag: bool = False) -> list[Proc]:
        """Members other than the leader, still alive; reaps those that died as our children.

        Blocking (reads /proc); ``by_tag`` also reads every process's environment.
        """
        table = process_table()
        me = os.getpid()
        pids = descendants(table, self.leader)
        pids.update(p.pid for p in table.values() if p.pgrp == self.leader)
        pids.update(pid for pid, start in self._seen.items() if _same(table, pid, start))
        if by_tag:
            pids.update(pid for pid in table if pid not in pids and self._entry in environ(pid))
        pids -= {self.leader, me, 1}
        members = [table[pid] for pid in pids]
        self._seen = {p.pid: p.start for p in members}
        for p in members:
            if p.state == "Z" and p.ppid == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)
        return [p for p in members if p.state != "Z"]

    def signal(self, members: Iterable[Proc], sig: int) -> None:
        """Send ``sig`` to the leader's group and to each member that is still itself."""
        signal_group(self.leader, sig)
        for p in members:
            send(p, sig)


def _same(table: Mapping[int, Proc], pid: int, start: int) -> bool:
    p = table.get(pid)
    return p is not None and p.start == start


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants instead of init (``PR_SET_CHILD_SUBREAPER``),
    so grandchildren whose parent died stay findable and reapable; False where unsupported."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    if prctl(ctypes.c_int(PR_SET_CHILD_SUBREAPER), one, zero, zero, zero) != 0:
        log.warning("subreaper_unavailable", error=os.strerror(ctypes.get_errno()))
        return False
    log.info("subreaper_enabled", pid=os.getpid())
    return True

"""Who holds a TCP port, as a restarted vLLM's bind would meet it.

vLLM binds its port with SO_REUSEADDR and SO_REUSEPORT before it loads the model and listens
only once it serves. A bound-but-not-listening socket is in no /proc/net/tcp table, binding
with SO_REUSEADDR does not collide with it, and a second SO_REUSEPORT socket of the same user
may even listen beside it: so the port counts as busy while any socket other than a TIME_WAIT
connection is on it. Holders are named from /proc/net/tcp{,6} and /proc/*/fd; a socket that is
bound only is recognised by asking it for its address (pidfd_getfd, where we may).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TCP_STATES = {"01": "established", "06": "time_wait", "07": "bound", "08": "close_wait",
              "0A": "listening"}
TIME_WAIT = "06"
SYS_PIDFD_OPEN = 434
SYS_PIDFD_GETFD = 438
"""Syscall numbers, the same on every architecture Linux added them to after 5.1."""


@dataclass(frozen=True)
class Holder:
    """A process holding a socket on the port, and what the socket is doing."""

    pid: int
    name: str
    state: str


@dataclass(frozen=True)
class PortUse:
    """Whether a restarted server's bind would collide on the port, and who holds it."""

    port: int
    busy: bool
    holders: tuple[Holder, ...] = ()

    def describe(self) -> str:
        """One line for logs and errors: ``pid 12 (VLLM::EngineCor, bound)``."""
        if not self.holders:
            return "a process we cannot see" if self.busy else "nothing"
        return ", ".join(f"pid {h.pid} ({h.name}, {h.state})" for h in self.holders)


def port_use(port: int) -> PortUse:
    """What holds TCP ``port`` on any local address. Blocking: reads /proc."""
    listed, time_wait = _tcp_table(port)
    plain_bind_fails = _plain_bind_fails(port)
    if not listed and not plain_bind_fails:
        return PortUse(port, busy=False)
    holders = tuple(_holders(port, listed, search_unlisted=plain_bind_fails and not listed))
    busy = bool(listed) or bool(holders) or (plain_bind_fails and not time_wait)
    return PortUse(port, busy, holders)


def _tcp_table(port: int) -> tuple[dict[int, str], bool]:
    """Socket inode → state of every /proc/net/tcp{,6} entry on local ``port``, TIME_WAIT
    aside, and whether a TIME_WAIT entry is there."""
    listed: dict[int, str] = {}
    time_wait = False
    for table in ("tcp", "tcp6"):
        for fields in _rows(table):
            if int(fields[1].rsplit(":", 1)[1], 16) != port:
                continue
            if fields[3] == TIME_WAIT:
                time_wait = True
            elif int(fields[9]):
                listed[int(fields[9])] = TCP_STATES.get(fields[3], f"state {fields[3]}")
    return listed, time_wait


def _rows(table: str) -> Iterator[list[str]]:
    try:
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) > 9:
            yield fields


def _plain_bind_fails(port: int) -> bool:
    """True when a bind without SO_REUSEADDR/SO_REUSEPORT on a wildcard address fails: some
    socket is bound to the port (or a TIME_WAIT connection remains)."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, wildcard in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((wildcard, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def _holders(port: int, listed: dict[int, str], *, search_unlisted: bool) -> Iterator[Holder]:
    """Processes holding a listed socket; with ``search_unlisted``, also those holding a
    TCP socket in no /proc/net table (bound only) whose address is ``port``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        state = next(_held(pid, port, listed, search_unlisted), None)
        if state is not None:
            yield Holder(pid, _name(pid), state)


def _held(pid: int, port: int, listed: dict[int, str], search_unlisted: bool) -> Iterator[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        inode = int(link[8:-1])
        if inode in listed:
            yield listed[inode]
        elif search_unlisted and _bound_to(pid, int(fd), port):
            yield "bound"


def _bound_to(pid: int, fd: int, port: int) -> bool:
    """Whether ``pid``'s socket ``fd`` is a TCP socket bound to ``port`` (False when we may
    not look: pidfd_getfd needs ptrace rights over ``pid``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return False
    try:
        copy = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            return False
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            return False
        with sock:
            inet = sock.family in (socket.AF_INET, socket.AF_INET6)
            return inet and sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port
    except OSError:
        return False
    finally:
        os.close(pidfd)


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"

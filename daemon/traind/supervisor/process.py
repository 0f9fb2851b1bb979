"""A supervised child: its environment, its process tree, its output, and stopping all of it.

Each child runs in a session of its own (``start_new_session``); stopping is SIGTERM to the
group and to every descendant that left it → grace → SIGKILL, and the final wait cannot be
cancelled. Output is read as it arrives (a full pipe freezes a child), logged line by line and
kept in size-rotated files.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import importlib
import logging
import os
import queue
import signal
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from logging.handlers import QueueListener, RotatingFileHandler
from pathlib import Path
from typing import Any, TypeVar

import structlog

from traind.config import ChildConfig, TrainerConfig
from traind.errors import SupervisorError
from traind.supervisor.policy import Role

log = structlog.get_logger("traind.supervisor")
T = TypeVar("T")

CHILD_TAG = "TRAIND_CHILD_ID"
"""Set in every child's environment; descendants inherit it, which finds escaped ones in /proc."""
DISTRIBUTED_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
     "MASTER_ADDR", "MASTER_PORT"}
)
SINGLE_NODE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
RUNTIME_VARS = frozenset({"TRAIND_RESUME_FROM", "TRAIND_HEARTBEAT", CHILD_TAG})
TRACK_INTERVAL = 1.0
KILL_WAIT = 10.0
MAX_LINE = 64 * 1024
PR_SET_CHILD_SUBREAPER = 36
IDLE_SLACK = 512 * 1024**2


class State(StrEnum):
    """supervisord's process states."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    EXITED = "EXITED"
    FATAL = "FATAL"


OnState = Callable[[str, State], None]
OnLine = Callable[[str, str], None]


def _dropped(name: str, role: Role) -> bool:
    if name == "NOTIFY_SOCKET" or name.startswith("WATCHDOG_") or name in RUNTIME_VARS:
        return True
    distributed = name in DISTRIBUTED_VARS or name.startswith("TORCHELASTIC_")
    return distributed and role is not Role.TRAINER


def child_env(base_env: Mapping[str, str], config: ChildConfig, role: Role) -> dict[str, str]:
    """The environment for a child: ``base_env`` without systemd's and (except for the trainer)
    torch.distributed's variables, GPUs pinned by PCI order, then the configured ``env``.

    Python children are unbuffered unless told otherwise, so their output (progress) streams.
    A trainer with ``distributed = true`` gets a single-node rank-0 environment by default.
    """
    env = {k: v for k, v in base_env.items() if not _dropped(k, role)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    if role is Role.TRAINER and isinstance(config, TrainerConfig) and config.distributed:
        for key, value in SINGLE_NODE.items():
            env.setdefault(key, value)
    if config.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in config.gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(config.env)
    return env


# --- /proc: who belongs to a child ----------------------------------------------------------


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


def descendants(table: Mapping[int, Proc], root: int) -> set[int]:
    """Pids below ``root`` in the parent tree of ``table``."""
    children: dict[int, list[int]] = defaultdict(list)
    for p in table.values():
        children[p.ppid].append(p.pid)
    found: set[int] = set()
    todo = list(children[root])
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children[pid])
    return found


def _has_tag(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


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
            pids.update(pid for pid in table if pid not in pids and _has_tag(pid, self._entry))
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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader, sig)
        for p in members:
            now = read_proc(p.pid)
            if now is not None and now.start == p.start and now.state != "Z":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)


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


# --- output ----------------------------------------------------------------------------------


class _Pipes(asyncio.SubprocessProtocol):
    """Splits stdout and stderr into lines as they arrive."""

    def __init__(
        self, on_line: Callable[[int, str, bytes], None], on_exit: Callable[[int, int], None]
    ) -> None:
        self._on_line = on_line
        self._on_exit = on_exit
        self._partial = {1: b"", 2: b""}
        self._transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        stream = "stdout" if fd == 1 else "stderr"
        *lines, rest = (self._partial[fd] + data).split(b"\n")
        if len(rest) > MAX_LINE:
            lines.append(rest)
            rest = b""
        self._partial[fd] = rest
        for line in lines:
            self._on_line(self._pid, stream, line)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if rest := self._partial.pop(fd, b""):
            self._on_line(self._pid, "stdout" if fd == 1 else "stderr", rest)

    def process_exited(self) -> None:
        assert self._transport is not None
        code = self._transport.get_returncode()
        self._on_exit(self._pid, -1 if code is None else code)

    @property
    def _pid(self) -> int:
        return self._transport.get_pid() if self._transport is not None else 0


class _ChildLog:
    """Appends a child's output to ``<dir>/<name>.log``, rotated by size, from a thread."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True
        )
        self._handler.setFormatter(
            logging.Formatter("%(asctime)s pid=%(child_pid)s %(stream)s %(message)s")
        )
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._listener = QueueListener(self._queue, self._handler)
        self._listener.start()

    def write(self, pid: int, stream: str, line: str) -> None:
        """Queue one line; never blocks the loop."""
        rec = logging.makeLogRecord({"msg": line, "child_pid": pid, "stream": stream})
        self._queue.put_nowait(rec)

    def close(self) -> None:
        """Flush and close (blocking: run in a thread)."""
        self._listener.stop()
        self._handler.close()


# --- the child -------------------------------------------------------------------------------


class ManagedProcess:
    """One supervised child: spawns its argv (never a shell) in a new session, drains and
    logs its output, tracks its process tree and stops all of it."""

    def __init__(
        self,
        name: str,
        config: ChildConfig,
        role: Role,
        *,
        log_dir: Path,
        base_env: Mapping[str, str] | None = None,
        on_state: OnState | None = None,
        on_line: OnLine | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.role = role
        self.state = State.EXITED
        self.pid: int | None = None
        self.returncode: int | None = None
        self.started_at = 0.0
        self.ended_at: float | None = None
        self.last_output = 0.0
        self._log_dir = log_dir
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._on_state = on_state
        self._on_line = on_line
        self._log = log.bind(child=name)
        self._transport: asyncio.SubprocessTransport | None = None
        self._exited = asyncio.Event()
        self._tree: ProcessTree | None = None
        self._tracker: asyncio.Task[None] | None = None
        self._file: _ChildLog | None = None
        self._stopping = asyncio.Lock()

    @property
    def running(self) -> bool:
        """True while the spawned process itself has not exited."""
        return self._transport is not None and self.returncode is None

    @property
    def uptime(self) -> float:
        """Seconds the last spawn ran (so far)."""
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return max(0.0, end - self.started_at) if self.started_at else 0.0

    def set_state(self, state: State) -> None:
        """Record a state change and tell the callback."""
        if state is self.state:
            return
        self._log.info("child_state", state=state.value, previous=self.state.value, pid=self.pid)
        self.state = state
        if self._on_state is not None:
            self._on_state(self.name, state)

    async def start(
        self, argv: Sequence[str] | None = None, extra_env: Mapping[str, str] | None = None
    ) -> int:
        """Spawn ``argv`` (default: the configured command); return its pid.

        Raise SupervisorError when it cannot be executed (missing binary, bad cwd).
        """
        if self._transport is not None:
            raise SupervisorError(f"{self.name} was started and not stopped")
        argv = tuple(argv if argv is not None else self.config.command)
        tag = f"{self.name}-{uuid.uuid4().hex}"
        env = child_env(self._base_env, self.config, self.role) | dict(extra_env or {})
        env[CHILD_TAG] = tag
        self.set_state(State.STARTING)
        self.returncode, self.ended_at, self.pid = None, None, None
        self._exited = asyncio.Event()
        c = self.config
        path = self._log_dir / f"{self.name}.log"
        self._file = await asyncio.to_thread(_ChildLog, path, c.log_max_bytes, c.log_backups)
        self.started_at = self.last_output = time.monotonic()
        try:
            transport, _ = await asyncio.get_running_loop().subprocess_exec(
                lambda: _Pipes(self._line, self._exit), *argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=c.cwd, env=env, start_new_session=True,
            )
        except OSError as exc:
            await asyncio.to_thread(self._file.close)
            self._file = None
            self._log.error("child_spawn_failed", argv=list(argv), error=str(exc))
            self.set_state(State.EXITED)
            raise SupervisorError(f"cannot start {self.name}: {argv[0]}: {exc}") from exc
        self._transport = transport
        self.pid = transport.get_pid()
        self._tree = ProcessTree(self.pid, tag)
        self._tracker = asyncio.create_task(self._track(self._tree))
        self._log.info("child_started", pid=self.pid, argv=list(argv))
        return self.pid

    async def wait(self) -> int:
        """Wait until the spawned process exits (not its pipes); return its exit code."""
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    async def stop(self, grace: float | None = None) -> int | None:
        """Stop the whole tree: SIGTERM, ``grace`` seconds (default ``stop_grace``), SIGKILL.

        Also cleans up after a child that exited on its own (its group and escaped
        descendants). Cancelling skips the rest of the grace period, never the kill and wait.
        """
        async with self._stopping:
            if self._transport is None:
                return self.returncode
            try:
                await self._terminate(self.config.stop_grace if grace is None else grace)
            finally:
                await uninterrupted(self._finish())
            return self.returncode

    # -- internals --

    def _line(self, pid: int, stream: str, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        self.last_output = time.monotonic()
        self._log.info("child_output", pid=pid, stream=stream, line=line)
        if self._file is not None:
            self._file.write(pid, stream, line)
        if self._on_line is not None:
            self._on_line(stream, line)

    def _exit(self, pid: int, code: int) -> None:
        self.pid = pid
        self.returncode = code
        self.ended_at = time.monotonic()
        self._exited.set()
        self._log.info("child_exited", pid=self.pid, returncode=code,
                       uptime=round(self.uptime, 3))
        if self.state is not State.STOPPING:
            self.set_state(State.EXITED)

    async def _track(self, tree: ProcessTree) -> None:
        while True:
            await asyncio.sleep(TRACK_INTERVAL)
            await asyncio.to_thread(tree.scan)

    async def _terminate(self, grace: float) -> None:
        assert self._tree is not None
        tree = self._tree
        members = await asyncio.to_thread(tree.scan, by_tag=True)
        if not members and not self.running:
            return
        if self.running:
            self.set_state(State.STOPPING)
        self._log.info("child_stopping", pid=self.pid, grace=grace,
                       others=[p.pid for p in members])
        tree.signal(members, signal.SIGTERM)
        deadline = time.monotonic() + grace
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._exited.wait()
        while members and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            members = await asyncio.to_thread(tree.scan)

    async def _finish(self) -> None:
        assert self._tree is not None
        assert self._transport is not None
        tree, transport = self._tree, self._transport
        deadline = time.monotonic() + KILL_WAIT
        killed: set[int] = set()
        while True:
            members = await asyncio.to_thread(tree.scan, by_tag=True)
            if not members and not self.running:
                break
            if time.monotonic() > deadline:
                self._log.error("child_unkillable", pid=self.pid, others=[p.pid for p in members])
                break
            fresh = {p.pid for p in members} | ({self.pid} if self.running and self.pid else set())
            if fresh - killed:
                self._log.warning("child_killed", pid=self.pid, pids=sorted(fresh - killed))
                killed |= fresh
            tree.signal(members, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self._exited.wait()
        if self._tracker is not None:
            self._tracker.cancel()
            self._tracker = None
        transport.close()
        if self._file is not None:
            await asyncio.to_thread(self._file.close)
            self._file = None
        self._transport = None
        if self.state is State.STOPPING:
            self.set_state(State.EXITED)


async def uninterrupted(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` to its end even if the caller is cancelled meanwhile, then re-raise the
    cancellation (what anyio's shielded cancel scope does in ``Process.aclose``)."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
        else:
            break
    if cancelled:
        raise asyncio.CancelledError
    return result


# --- resources a restarted vLLM needs back ---------------------------------------------------


def port_in_use(port: int) -> bool:
    """True while something listens on TCP ``port`` on any local address (binding the
    wildcard address with SO_REUSEADDR fails, as the restarted server's bind would)."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, wildcard in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((wildcard, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


async def wait_port_free(port: int, limit: float) -> bool:
    """Wait up to ``limit`` seconds until nothing listens on TCP ``port``; False (and a log
    event) when it is still busy."""
    deadline = time.monotonic() + limit
    while await asyncio.to_thread(port_in_use, port):
        if time.monotonic() > deadline:
            log.warning("port_still_busy", port=port, waited=limit)
            return False
        await asyncio.sleep(0.2)
    return True


def gpu_memory_used(gpus: Sequence[int]) -> dict[int, int] | None:
    """Used memory in bytes per GPU index (NVML order = PCI bus order), or None without NVML."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
        try:
            return {
                i: int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used)
                for i in gpus
            }
        finally:
            nvml.nvmlShutdown()
    except nvml.NVMLError:
        return None


async def wait_gpus_idle(
    gpus: Sequence[int], idle: Mapping[int, int] | None, limit: float
) -> bool:
    """Wait up to ``limit`` seconds until every GPU in ``gpus`` is back near its ``idle``
    memory use; True at once without NVML or a baseline, False (and a log event) if not."""
    deadline = time.monotonic() + limit
    while gpus and idle is not None:
        used = await asyncio.to_thread(gpu_memory_used, gpus)
        if used is None or all(used[g] <= idle.get(g, 0) + IDLE_SLACK for g in gpus):
            break
        if time.monotonic() > deadline:
            log.warning("gpus_still_busy", used=used, idle=dict(idle), waited=limit)
            return False
        await asyncio.sleep(0.5)
    return True

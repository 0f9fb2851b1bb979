"""One supervised child: spawning it and stopping all of it.

Each child runs in a session of its own (``start_new_session``); stopping is SIGTERM to the
group and to every descendant that left it → grace → SIGKILL, and the final wait cannot be
cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path

import structlog

from traind.config import ChildConfig
from traind.errors import SupervisorError
from traind.supervisor.env import CHILD_TAG, OWNER_TAG, child_env, new_tag
from traind.supervisor.output import ChildLog, Pipes
from traind.supervisor.policy import Role
from traind.supervisor.procfs import Proc, ProcessTree
from traind.util import redact
from traind.util.poll import poll_until
from traind.util.proc.child import spawn_with, uninterrupted

log = structlog.get_logger("traind.supervisor")

TRACK_INTERVAL = 1.0
KILL_WAIT = 10.0


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


class ManagedProcess:
    """One supervised child: spawns its argv (never a shell) in a new session, drains and
    logs its output, tracks its process tree (``track``) and stops all of it.

    ``owner`` (see ``env.owner_of``) marks the child as its daemon's, so that a daemon
    restarted after being killed can find and stop it (``supervisor.leftovers``).
    """

    def __init__(
        self,
        name: str,
        config: ChildConfig,
        role: Role,
        *,
        log_dir: Path,
        base_env: Mapping[str, str] | None = None,
        owner: str | None = None,
        on_state: OnState | None = None,
        on_line: OnLine | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.role = role
        self.state = State.EXITED
        self._changed = False
        self.pid: int | None = None
        self.returncode: int | None = None
        self.last_exit: int | None = None
        """The exit code of the last spawn that ended, kept across restarts (``returncode``
        is the current spawn's, None while it runs)."""
        self.started_at = 0.0
        self.ended_at: float | None = None
        self.last_output = 0.0
        self._log_dir = log_dir
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._owner = owner
        self._on_state = on_state
        self._on_line = on_line
        self._log = log.bind(child=name)
        self._transport: asyncio.SubprocessTransport | None = None
        self._exited = asyncio.Event()
        self._tree: ProcessTree | None = None
        self._file: ChildLog | None = None
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
        # Before its first change a child never ran: its initial EXITED is no previous state.
        previous = {"previous": self.state.value} if self._changed else {}
        self._log.info("child_state", state=state.value, pid=self.pid, **previous)
        self.state = state
        self._changed = True
        if self._on_state is not None:
            self._on_state(self.name, state)

    async def start(
        self,
        argv: Sequence[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        facts: Mapping[str, object] | None = None,
    ) -> int:
        """Spawn ``argv`` (default: the configured command); return its pid. ``facts`` are
        added to its ``child_started`` event.

        Raise SupervisorError when it cannot be executed (missing binary, bad cwd).
        """
        if self._transport is not None:
            raise SupervisorError(f"{self.name} was started and not stopped")
        argv = tuple(argv if argv is not None else self.config.command)
        tag = new_tag(self.name)
        env = child_env(self._base_env, self.config, self.role) | dict(extra_env or {})
        env[CHILD_TAG] = tag
        if self._owner is not None:
            env[OWNER_TAG] = self._owner
        self.set_state(State.STARTING)
        self.returncode, self.ended_at, self.pid = None, None, None
        self._exited = asyncio.Event()
        c = self.config
        path = self._log_dir / f"{self.name}.log"
        self._file = await asyncio.to_thread(ChildLog, path, c.log_max_bytes, c.log_backups)
        self.started_at = self.last_output = time.monotonic()
        try:
            transport = await spawn_with(
                lambda: Pipes(self._line, self._exit), argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=c.cwd, env=env,
            )
        except OSError as exc:
            await asyncio.to_thread(self._file.close)
            self._file = None
            self._log.error("child_spawn_failed", argv=redact.argv(argv), error=str(exc))
            self.set_state(State.EXITED)
            raise SupervisorError(f"cannot start {self.name}: {argv[0]}: {exc}") from exc
        self._transport = transport
        self.pid = transport.get_pid()
        self._tree = ProcessTree(self.pid, tag)
        self._log.info("child_started", pid=self.pid, argv=redact.argv(argv), **(facts or {}))
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
        self.returncode = self.last_exit = code
        self.ended_at = time.monotonic()
        self._exited.set()
        self._log.info("child_exited", pid=self.pid, returncode=code,
                       uptime=round(self.uptime, 3))
        if self.state is not State.STOPPING:
            self.set_state(State.EXITED)

    async def track(self) -> str:
        """Scan the spawned tree every ``TRACK_INTERVAL`` until cancelled, so that
        descendants are remembered when reparented and adopted ones are reaped. Run by the
        caller beside the child (the supervisor's runner), after ``start``."""
        assert self._tree is not None
        tree = self._tree
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
        if members:
            await poll_until(lambda: asyncio.to_thread(tree.scan), done=lambda m: not m,
                             within=deadline - time.monotonic(), every=0.05)

    async def _finish(self) -> None:
        assert self._tree is not None
        assert self._transport is not None
        tree, transport = self._tree, self._transport
        killed: set[int] = set()

        def gone(members: list[Proc]) -> bool:
            return not members and not self.running

        async def kill() -> list[Proc]:
            """What is left of the tree, SIGKILLed; each pid is logged once."""
            members = await asyncio.to_thread(tree.scan, by_tag=True)
            if not gone(members):
                fresh = {p.pid for p in members}
                if self.running and self.pid:
                    fresh.add(self.pid)
                if fresh - killed:
                    self._log.warning("child_killed", pid=self.pid, pids=sorted(fresh - killed))
                    killed.update(fresh)
                tree.signal(members, signal.SIGKILL)
            return members

        left = await poll_until(kill, done=gone, within=KILL_WAIT, every=0.05)
        if not gone(left):
            self._log.error("child_unkillable", pid=self.pid, others=[p.pid for p in left])
        transport.close()
        if self._file is not None:
            await asyncio.to_thread(self._file.close)
            self._file = None
        self._transport = None
        if self.state is State.STOPPING:
            self.set_state(State.EXITED)

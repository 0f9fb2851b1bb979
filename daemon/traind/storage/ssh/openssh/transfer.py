"""The ``transfer = "openssh"`` mode: file data through the system ``ssh``, SFTP spoken here.

Each connection is ``ssh ... -s <host> sftp`` (``ssh/command``: the SFTP mode's host-key
policy; a subsystem, so no remote command is built from a path) with a worker thread of its
own driving the pipes (``pipe``): OpenSSH's C client does the encryption, where asyncssh
pays Python per 32 KiB packet, and everything per packet (read, hash, send, acknowledgements)
stays in that thread; the event loop only starts and awaits whole files. Connections are
reused from file to file, up to ``concurrency``; each ssh runs in its own process group and
is always reaped (``traind.util.proc.child``). A dropped connection is a
TransientStorageError, retried with backoff like the SFTP mode's. What the choices here were
measured against is in bench/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import structlog

from traind.errors import StorageError, TransientStorageError
from traind.storage.base import Advance, counted
from traind.storage.ssh.command import sftp_argv, ssh_failure
from traind.storage.ssh.link import SSHLink, retrying
from traind.storage.ssh.openssh import wire
from traind.storage.ssh.openssh.pipe import ConnectionLost, SFTPPipe
from traind.util.fileio import temporary_name
from traind.util.proc import child, priority

P = ParamSpec("P")
T = TypeVar("T")
log = structlog.get_logger("traind.ssh")

PIPE_SIZE = 1024 * 1024
"""Bytes each pipe to ssh holds (Linux's default maximum for unprivileged users)."""

STOP_GRACE = 5.0
"""Seconds ssh gets to exit after SIGTERM, and again after SIGKILL."""

WORTH_A_CONNECTION = 64 * 1024 * 1024
"""Bytes a transfer must have to start an ssh of its own while another is open: every new one
pays a key exchange (OpenSSH's default sntrup761x25519) and a start-up in client CPU and time."""


class OpenSSHTransfer:
    """Uploads and downloads over a pool of ``ssh -s <host> sftp`` processes."""

    def __init__(self, link: SSHLink, owner: str) -> None:
        self._link = link
        self._owner = owner
        """This store's token in temporary names: no other writer's, reused by its retries."""
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or opening
        self._warming: asyncio.Task[_Connection] | None = None
        self._changed = asyncio.Event()

    def warm(self) -> None:
        """Start a connection in the background when none is open or opening, for the next
        transfer to take: the store's metadata calls before an upload (the claim, the check
        that the tag is not committed) then overlap ssh's start-up and key exchange, which
        the first file would otherwise wait for."""
        if self._open == 0:
            self._open += 1
            self._warming = asyncio.ensure_future(_Connection.start(self._link))

    async def put(
        self, local: Path, remote: str, size: int, advance: Advance
    ) -> tuple[int, str]:
        """Upload ``local`` (``size`` bytes) to ``remote`` (temporary name, fsync, rename):
        (bytes, sha256). A dropped connection is retried; progress is taken back on failure."""
        part = temporary_name(remote, self._owner)

        def put(pipe: SFTPPipe, src: Path, dst: str, moved: Advance) -> tuple[int, str]:
            return pipe.put(src, dst, part, moved)

        return await retrying(self._link.config, f"upload {remote}",
                              lambda: self._run(size, put, local, remote, advance))

    async def get(
        self, remote: str, local: Path, size: int, advance: Advance
    ) -> tuple[int, str]:
        """Download ``remote`` (no more than its ``size`` bytes) into ``local`` (written,
        fsynced): (bytes, sha256 of what was written)."""
        def get(pipe: SFTPPipe, src: str, dst: Path, moved: Advance) -> tuple[int, str]:
            return pipe.get(src, dst, size, moved)

        return await retrying(self._link.config, f"download {remote}",
                              lambda: self._run(size, get, remote, local, advance))

    async def probe(self) -> None:
        """Check that ssh runs and the SFTP subsystem starts and offers what this mode needs."""
        async with self._lease(0):
            pass

    async def aclose(self) -> None:
        """Stop every idle ssh process, and the one starting for a transfer that never came."""
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        if (warming := self._warming) is not None:
            self._warming = None
            self._forget()
            warming.cancel()
            started = (await asyncio.gather(warming, return_exceptions=True))[0]
            if isinstance(started, _Connection):
                idle.append(started)
        await asyncio.gather(*(conn.aclose() for conn in idle))

    async def _run(
        self, size: int, op: Callable[[SFTPPipe, Any, Any, Advance], tuple[int, str]],
        source: Any, dest: Any, advance: Advance,
    ) -> tuple[int, str]:
        with counted(advance) as moved:
            async with self._lease(size) as conn:
                return await conn.run(op, source, dest, moved)

    @contextlib.asynccontextmanager
    async def _lease(self, size: int) -> AsyncIterator[_Connection]:
        """A connection for one transfer of ``size`` bytes. A transfer that fails leaves
        the stream in an unknown state, so its connection is closed, not reused."""
        conn = await self._take(size)
        try:
            yield conn
        except BaseException:
            self._forget()
            await conn.aclose()
            raise
        self._idle.append(conn)
        self._notify()

    async def _take(self, size: int) -> _Connection:
        """An idle connection; else a new one, unless ``concurrency`` are open or the
        transfer is too small to be worth one (then it waits for one to be free)."""
        while True:
            while self._idle:
                conn = self._idle.pop()
                if conn.alive:
                    return conn
                self._forget()
                await conn.aclose()
            if (warming := self._warming) is not None:  # started by ``warm`` for us
                self._warming = None
                try:
                    return await warming
                except BaseException:
                    self._forget()
                    raise
            room = self._open < self._link.config.concurrency
            if room and (self._open == 0 or size >= WORTH_A_CONNECTION):
                break
            await self._changed.wait()
        self._open += 1
        try:
            return await _Connection.start(self._link)
        except BaseException:
            self._forget()
            raise

    def _forget(self) -> None:
        """Count one connection less (it is closing) and wake whoever waits for one."""
        self._open -= 1
        self._notify()

    def _notify(self) -> None:
        # Wakes every waiter on the current event; later waiters wait on a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()


class _Connection:
    """One ssh process, the SFTP pipe to it, and the one thread that drives that pipe."""

    def __init__(self, proc: asyncio.subprocess.Process, pipe: SFTPPipe, link: SSHLink) -> None:
        self._proc = proc
        self._pipe = pipe
        self._link = link
        self._thread = priority.executor(1, "traind-openssh")
        assert proc.stderr is not None
        self._stderr = asyncio.ensure_future(proc.stderr.read())
        self._work: asyncio.Future[Any] | None = None
        self._closing: asyncio.Future[None] | None = None

    @classmethod
    async def start(cls, link: SSHLink) -> _Connection:
        """Start ssh and the SFTP session; fail with what ssh said if it does not come up."""
        link.warn_if_unverified()
        started = time.monotonic()
        child_in, ours_out = os.pipe()
        ours_in, child_out = os.pipe()
        for fd in (ours_out, ours_in):
            with contextlib.suppress(OSError):  # over the per-user pipe quota: keep 64 KiB
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        try:
            proc = await child.spawn(
                sftp_argv(link.config, link.known_hosts), transfer=True,
                stdin=child_in, stdout=child_out, stderr=asyncio.subprocess.PIPE,
            )
        except BaseException as exc:
            os.close(ours_out)
            os.close(ours_in)
            if isinstance(exc, OSError):
                raise StorageError(
                    f'transfer = "openssh" needs the ssh client (Debian: openssh-client): {exc}'
                ) from exc
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        conn = cls(proc, SFTPPipe(ours_out, ours_in, str(link.target)), link)
        try:
            async with asyncio.timeout(2 * link.config.connect_timeout):
                server = await conn.run(SFTPPipe.handshake)
        except BaseException as exc:
            await conn.aclose()
            if isinstance(exc, TimeoutError):
                raise TransientStorageError(f"{link.target}: start sftp: timed out") from exc
            raise
        log.info("ssh_openssh_connected", host=link.target.host, port=link.target.port,
                 pid=proc.pid, write=server.write, read=server.read,
                 seconds=round(time.monotonic() - started, 3))
        return conn

    @property
    def alive(self) -> bool:
        """Whether ssh still runs (as far as the loop has noticed)."""
        return self._proc.returncode is None

    async def run(
        self, fn: Callable[Concatenate[SFTPPipe, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(pipe, ...)`` in this connection's thread. If ssh is gone, the error says
        why (what it printed); cancelling leaves the thread running until ``aclose``."""
        loop = asyncio.get_running_loop()
        self._work = loop.run_in_executor(
            self._thread, functools.partial(fn, self._pipe, *args, **kwargs))
        try:
            return await asyncio.shield(self._work)
        except ConnectionLost as exc:
            await self.aclose()
            raise self._explain(exc) from exc
        except wire.ProtocolError as exc:
            raise StorageError(
                f"{self._link.target}: the SFTP stream is garbled ({exc}); a login script "
                "that prints to stdout on the server does this"
            ) from exc

    async def aclose(self) -> None:
        """Stop ssh and wait until it is gone; safe to call again, and a cancelled caller
        does not cut the stopping short."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        """SIGTERM to ssh's process group, SIGKILL after ``STOP_GRACE``; the pipe is closed
        once the thread using it is done (ssh's exit ends the thread's I/O)."""
        if self._proc.returncode is None:
            await child.stop(self._proc, STOP_GRACE, (signal.SIGTERM, signal.SIGKILL))
        pending = [f for f in (self._work, self._stderr) if f is not None]
        await asyncio.wait(pending, timeout=STOP_GRACE)
        if self._work is None:
            self._pipe.close()
        elif self._work.done():
            self._finished(self._work)
        else:  # stuck in local I/O: close when it returns
            self._work.add_done_callback(self._finished)
        self._thread.shutdown(wait=False)

    def _finished(self, work: asyncio.Future[Any]) -> None:
        """Close the pipe once the thread is done with it. Its error, if any, is the cut pipe
        of a cancelled caller: taken here, or asyncio logs it as never retrieved."""
        if not work.cancelled():
            work.exception()
        self._pipe.close()

    def _explain(self, exc: ConnectionLost) -> StorageError:
        """The error ssh's exit means: what its stderr names, else the connection lost."""
        stderr = self._stderr
        readable = stderr.done() and not stderr.cancelled() and not stderr.exception()
        said = stderr.result().decode(errors="replace") if readable else ""
        if known := ssh_failure(said, self._link):
            return known
        tail = " | ".join(said.strip().splitlines()[-3:])
        return ConnectionLost(f"{exc} (ssh exited with {self._proc.returncode}: {tail})")

"""Child processes that cannot outlive what started them: each runs in a session of its own,
stopping one signals its whole process group, and the wait for it to go cannot be cut short
by a cancellation (what anyio's ``Process.aclose`` does).

A leaf module: the supervisor, the storage backends and the launch adapters all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from traind.util.proc import priority

T = TypeVar("T")

KILL_GRACE = 5.0
"""Seconds a killed child is given to be reaped when its caller was cancelled."""


async def spawn(
    argv: Sequence[str], *, transfer: bool = False, **options: Any
) -> asyncio.subprocess.Process:
    """Start ``argv`` (never a shell) in a new session, so that its process group is its own;
    ``options`` as ``asyncio.create_subprocess_exec`` takes them. A ``transfer`` (ssh or
    rsync moving checkpoint bytes) runs at the transfer priority (``priority``)."""
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True, **options)
    if transfer:
        try:
            await priority.lower_group(proc.pid)
        except BaseException:  # cancelled: nobody else holds it to stop it
            await stop(proc, KILL_GRACE)
            raise
    return proc


async def spawn_with(
    protocol: Callable[[], asyncio.SubprocessProtocol], argv: Sequence[str], **options: Any
) -> asyncio.SubprocessTransport:
    """``spawn`` for a caller that reads the child through a protocol of its own."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.subprocess_exec(protocol, *argv, start_new_session=True,
                                              **options)
    return transport


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` leads; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop(
    proc: asyncio.subprocess.Process, grace: float,
    signals: Sequence[int] = (signal.SIGKILL,),
) -> None:
    """Send ``signals`` in turn to ``proc``'s group, each followed by up to ``grace`` seconds
    for ``proc`` to exit, until it has. The first always goes out (an exited leader can leave
    its group behind: rsync's ssh, a shell's children); a cancelled caller still waits."""
    await uninterrupted(_stop(proc, grace, signals))


async def _stop(proc: asyncio.subprocess.Process, grace: float, signals: Sequence[int]) -> None:
    for n, sig in enumerate(signals):
        if n and proc.returncode is not None:
            return
        signal_group(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)


@contextlib.asynccontextmanager
async def stopped_on_error(
    proc: asyncio.subprocess.Process, grace: float
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``proc`` for the block; a block that fails or is cancelled kills its group first."""
    try:
        yield proc
    except BaseException:
        await stop(proc, grace)
        raise


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

"""A child process's lifecycle (``traind.util.proc.child``): its own session, its whole
group stopped, and a stop that a cancellation cannot cut short."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from traind.launch.host.commands import run_local
from traind.util.proc import child

# A shell that starts a grandchild in its group, says its pid, and waits on it.
FAMILY = 'sleep 300 & echo "$!"; wait'


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def until_gone(pid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not gone(pid):
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        await asyncio.sleep(0.05)


async def family() -> tuple[asyncio.subprocess.Process, int]:
    proc = await child.spawn(["sh", "-c", FAMILY], stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 10)
    return proc, int(line)


async def test_a_child_leads_its_own_session_and_stop_ends_its_group() -> None:
    """``spawn`` puts the child in a session (and group) of its own; ``stop`` takes the
    grandchild in that group down with it."""
    proc, grandchild = await family()
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        assert os.getpgid(grandchild) == proc.pid
        await asyncio.wait_for(child.stop(proc, 5.0), 15)
        assert proc.returncode == -signal.SIGKILL
        await until_gone(grandchild)
    finally:
        child.signal_group(proc.pid, signal.SIGKILL)


async def test_a_cancelled_stop_still_waits_until_the_child_is_gone() -> None:
    """Cancelling the caller of ``stop`` does not cut its wait short: SIGTERM (ignored here),
    the grace period, SIGKILL, and only then the cancellation."""
    proc = await child.spawn(["sh", "-c", 'trap "" TERM; echo up; sleep 300'],
                             stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 10)
        stopping = asyncio.ensure_future(
            child.stop(proc, 1.0, (signal.SIGTERM, signal.SIGKILL)))
        await asyncio.sleep(0.2)
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(stopping, 15)
        assert proc.returncode == -signal.SIGKILL  # ignored TERM, then KILL, then the raise
    finally:
        child.signal_group(proc.pid, signal.SIGKILL)


async def test_a_failing_block_kills_the_childs_group() -> None:
    """``stopped_on_error`` kills the group of a child whose block raised, then re-raises."""
    proc, grandchild = await family()
    try:
        with pytest.raises(RuntimeError, match="block failed"):
            async with child.stopped_on_error(proc, 5.0):
                raise RuntimeError("block failed")
        assert proc.returncode == -signal.SIGKILL
        await until_gone(grandchild)
    finally:
        child.signal_group(proc.pid, signal.SIGKILL)


async def test_a_cancelled_local_command_takes_its_children_down(tmp_path: Path) -> None:
    """A launch adapter's command cancelled mid-run leaves nothing of its group running."""
    pidfile = tmp_path / "pid"
    task = asyncio.ensure_future(
        run_local(["sh", "-c", f'sleep 300 & echo "$!" > {pidfile}; wait'], within=60))
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    await until_gone(int(pidfile.read_text()))

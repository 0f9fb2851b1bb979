"""Transfer work runs below the daemon's priority; the calling thread and other children do
not (Linux gives each thread a nice value of its own)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from tests.support.procfs import autogroup_nice, autogroups, nice_of

from traind.util.proc import child, priority

pytestmark = pytest.mark.skipif(not priority.per_thread(), reason="per-thread nice is Linux's")


def this_thread_nice() -> int:
    """The calling thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.fixture
def base() -> Iterator[int]:
    """This thread's nice value; transfers back at it (nothing lowered) afterwards."""
    yield this_thread_nice()
    priority.lower_transfers(0)


def test_transfer_threads_run_lower_and_the_caller_stays(base: int) -> None:
    assert priority.lower_transfers(5) == min(19, base + 5)
    with priority.executor(2) as pool:
        assert {pool.submit(this_thread_nice).result() for _ in range(4)} == {min(19, base + 5)}
    assert this_thread_nice() == base
    assert priority.transfer_nice() == min(19, base + 5)


def test_zero_lowers_nothing(base: int) -> None:
    assert priority.lower_transfers(0) is None
    assert priority.transfer_nice() is None
    with priority.executor(1) as pool:
        assert pool.submit(this_thread_nice).result() == base


def test_the_lowest_priority_is_the_cap(base: int) -> None:
    assert priority.lower_transfers(19) == min(19, base + 19)
    assert priority.lower_transfers(40) == 19  # past the lowest from any base (-20 .. 19)


async def test_a_transfer_child_runs_lower_another_child_does_not(base: int) -> None:
    priority.lower_transfers(3)
    transfer = await child.spawn(["sleep", "30"], transfer=True)
    other = await child.spawn(["sleep", "30"])
    try:
        assert nice_of(transfer.pid) == min(19, base + 3)
        assert nice_of(other.pid) == base
        if autogroups():  # each leads a session, so each has an autogroup of its own
            assert autogroup_nice(transfer.pid) == min(19, base + 3)
            assert autogroup_nice(other.pid) == 0
    finally:
        async with asyncio.timeout(10):
            await child.stop(transfer, 5)
            await child.stop(other, 5)


async def test_the_session_is_lowered_only_by_its_leader(base: int) -> None:
    """Not leading its session (this test run), a process leaves its autogroup, shared with
    the shell that started it, alone."""
    priority.lower_transfers(3)
    if os.getsid(0) == os.getpid():
        pytest.skip("this test process leads its session")  # lowering would slow the suite
    before = autogroup_nice(os.getpid())
    assert await priority.lower_session() is False
    assert autogroup_nice(os.getpid()) == before

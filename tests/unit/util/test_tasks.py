"""Bounded fan-out for backends: once one call fails, no call still waiting starts."""

from __future__ import annotations

import asyncio

import pytest

from traind.errors import StorageError
from traind.util.tasks import Slots, each_time, fan_out, task_group


async def test_after_a_failure_no_waiting_call_starts() -> None:
    """A call waiting for the slot a failing one held is cancelled, never started (work it
    would hand to a thread could not be stopped), and the failure is what the group raises."""
    slots = Slots(1)
    started: list[str] = []

    async def fails() -> None:
        started.append("first")
        raise StorageError("boom")

    async def waits() -> None:
        started.append("second")

    async def both() -> None:
        async with task_group() as tg:
            tg.create_task(slots.run(fails))
            tg.create_task(slots.run(waits))

    with pytest.raises(StorageError, match="boom"):
        await both()
    assert started == ["first"]


async def test_slots_bound_how_many_run_at_once() -> None:
    """No more than ``count`` calls run at the same time, and every result comes back."""
    slots, running, most = Slots(2), 0, 0

    async def one(n: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return n

    async with task_group() as tg:
        tasks = [tg.create_task(slots.run(lambda n=n: one(n))) for n in range(6)]
    assert most == 2
    assert [t.result() for t in tasks] == list(range(6))


async def test_fan_out_bounds_calls_and_keeps_the_order_of_results() -> None:
    """``fan_out`` runs at most ``limit`` calls at once and returns results in item order."""
    running, most = 0, 0

    async def one(n: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01 * (6 - n))  # later items finish first
        running -= 1
        return n * 10

    assert await fan_out(range(6), 3, one) == [0, 10, 20, 30, 40, 50]
    assert most == 3


async def test_fan_out_raises_the_failure_itself_and_starts_nothing_after_it() -> None:
    """The first failure is raised by itself (not an ExceptionGroup) and no waiting item
    starts once it happened."""
    started: list[int] = []

    async def one(n: int) -> None:
        started.append(n)
        if n == 0:
            raise StorageError("boom")

    with pytest.raises(StorageError, match="boom"):
        await fan_out(range(4), 1, one)
    assert started == [0]


async def test_each_time_runs_once_per_set_and_again_for_a_set_meanwhile() -> None:
    """A set while the action runs makes one more run; nothing runs while the event is clear."""
    event = asyncio.Event()
    runs: list[int] = []
    release = asyncio.Event()

    async def action() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            event.set()  # set again while the first run is running
        await release.wait()

    task = asyncio.create_task(each_time(event, action))
    event.set()
    release.set()
    await asyncio.sleep(0.05)
    task.cancel()
    assert runs == [0, 1]

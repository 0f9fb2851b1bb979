"""Concurrency for backends: a TaskGroup whose failure is one error, not an ExceptionGroup,
slots that bound how many of its tasks run at once, ``fan_out`` made of the two, and
``each_time`` for a loop driven by an event.

The streamer and the CLI expect a StorageError (or the cancellation) itself. When several
tasks fail at once, a permanent error wins over a transient one, so the caller does not
retry what cannot succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

from traind.errors import TransientStorageError

T = TypeVar("T")
X = TypeVar("X")


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """``asyncio.TaskGroup`` raising the most telling failure of its tasks by itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            yield tg
    except BaseExceptionGroup as group:
        errors = [e for e in _leaves(group) if not isinstance(e, asyncio.CancelledError)]
        permanent = [e for e in errors if not isinstance(e, TransientStorageError)]
        chosen = (permanent or errors or list(group.exceptions))[0]
        raise chosen from chosen.__cause__


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found


class Slots:
    """At most ``count`` calls at once; once one has failed, none still waiting starts.

    A failing task's slot is handed on before its task group cancels the others, and work a
    woken task hands to a thread would run on regardless (a file copied after its upload
    already failed, say): such a task is cancelled instead of running.
    """

    def __init__(self, count: int) -> None:
        self._free = asyncio.Semaphore(count)
        self._failed = False

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await ``fn()`` in a free slot."""
        async with self._free:
            if self._failed:
                raise asyncio.CancelledError  # the group is failing: this one never starts
            try:
                return await fn()
            except BaseException:
                self._failed = True
                raise


async def fan_out(items: Iterable[X], limit: int, fn: Callable[[X], Awaitable[T]]) -> list[T]:
    """``fn(item)`` for every item, at most ``limit`` at once; the results in ``items``' order.

    The first failure cancels the calls running and keeps those waiting from starting
    (``Slots``), and is raised by itself (``task_group``).
    """
    slots = Slots(limit)
    async with task_group() as tg:
        tasks = [tg.create_task(slots.run(functools.partial(fn, item))) for item in items]
    return [t.result() for t in tasks]


async def each_time(event: asyncio.Event, action: Callable[[], Awaitable[None]]) -> None:
    """Run ``action`` each time ``event`` is set (cleared first, so a set during the action
    runs it once more), until cancelled."""
    while True:
        await event.wait()
        event.clear()
        await action()

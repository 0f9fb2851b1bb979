"""Bounded waits for tests: poll a condition until it holds, or fail after a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``check`` until it holds, for at most ``within`` seconds (TimeoutError then)."""
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - a condition of the test's, not an event
            await asyncio.sleep(0.01)


async def cancelled_at_once(wait: Awaitable[object]) -> None:
    """Run ``wait`` a moment, cancel it, and check it ends within a second, CancelledError."""
    task = asyncio.ensure_future(wait)
    await asyncio.sleep(0.05)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert time.monotonic() - started < 1.0

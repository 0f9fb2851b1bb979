"""Bounded waits for tests: poll a condition until it holds, or fail after a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``check`` until it holds, for at most ``within`` seconds (TimeoutError then)."""
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - a condition of the test's, not an event
            await asyncio.sleep(0.01)

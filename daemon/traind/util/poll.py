"""The one deadline poll: ask again and again until the answer is the one waited for, or
until the time given for it is up."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

from traind.util.retry import Backoff

T = TypeVar("T")


async def poll_until(
    probe: Callable[[], Awaitable[T]],
    *,
    done: Callable[[T], bool] = bool,
    within: float | None,
    every: float | Backoff,
) -> T:
    """Await ``probe()`` until ``done`` accepts its answer (by default: a true one) or
    ``within`` seconds have passed (None: no deadline), pausing ``every`` seconds, or by the
    backoff, between probes but never past the deadline. Returns the last answer, accepted or
    not, since each caller reports a wait that ran out in its own words; cancellation passes
    through at once."""
    loop = asyncio.get_running_loop()
    deadline = math.inf if within is None else loop.time() + within
    pace = every if isinstance(every, Backoff) else Backoff(every, every)
    n = 0
    while not done(answer := await probe()):
        left = deadline - loop.time()
        if left <= 0:
            break
        await asyncio.sleep(min(pace.delay(n), left))
        n += 1
    return answer

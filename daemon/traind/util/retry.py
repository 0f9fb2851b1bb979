"""The one retry loop and the one backoff: capped exponential, with jitter, retrying while a
predicate calls the failure transient, each retry handed to a callback that logs it.

S3, SSH, the daemon's wait for the store, the journal on a full disk, the joint resume and
the cloud clients retry through ``retrying``; the streamer waits out a failed upload by
``Backoff.delay``, the supervisor's restart policy spaces restarts by it, and ``poll_until``
(util/poll.py) may pace its polls by it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from traind.errors import StorageError

T = TypeVar("T")
OnRetry = Callable[[BaseException, int, float], None]
"""Told the failure, how many attempts have failed so far (1 after the first) and the seconds
to wait before the next."""


@dataclass(frozen=True)
class Backoff:
    """Seconds to wait before retry number ``n`` (0-based): ``initial`` doubled ``n`` times,
    never above ``cap``, spread at random by ``jitter`` (0 to 1) so that clients failing
    together do not retry together. The spread reaches down to ``(1 - jitter)`` of that, never
    below ``initial``; ``around`` it reaches ``jitter`` either side, never above ``cap``."""

    initial: float
    cap: float
    jitter: float = 0.0
    around: bool = False

    def delay(self, n: int, rand: Callable[[], float] = random.random) -> float:
        """The pause before retry number ``n``; ``rand`` draws the jitter from [0, 1)."""
        top = min(self.cap, self.initial * 2.0 ** min(n, 64))
        if not self.jitter:
            return top
        if self.around:
            return min(self.cap, top * (1.0 - self.jitter + 2.0 * self.jitter * rand()))
        low = min(top, max(self.initial, top * (1.0 - self.jitter)))
        return low + (top - low) * rand()


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a store failure that may pass (a TransientStorageError)."""
    return isinstance(exc, StorageError) and exc.transient


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    backoff: Backoff,
    retries: int | None,
    is_transient: Callable[[BaseException], bool] = transient,
    on_retry: OnRetry | None = None,
    failed: int = 0,
) -> T:
    """Await ``attempt()`` until it succeeds; a failure ``is_transient`` calls transient is
    retried after ``backoff``, at most ``retries`` times (None: until it succeeds), any other
    failure, or the last, is raised as it is. ``failed`` counts failures already reported
    elsewhere: the first attempt waits as the retry after them would. Cancellation passes
    through at once."""
    n = failed
    if n:
        await asyncio.sleep(backoff.delay(n - 1))
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not is_transient(exc) or (retries is not None and n - failed >= retries):
                raise
            pause = backoff.delay(n)
            n += 1
            if on_retry is not None:
                on_retry(exc, n, pause)
        await asyncio.sleep(pause)

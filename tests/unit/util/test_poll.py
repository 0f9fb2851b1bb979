"""The one deadline poll: probes until done, the deadline, the pace, the last answer,
cancellation."""

from __future__ import annotations

import asyncio
import time

from tests.support.waits import cancelled_at_once

from traind.util.poll import poll_until
from traind.util.retry import Backoff


class Counter:
    """A probe answering 1, 2, 3, ... with the monotonic time of each call kept."""

    def __init__(self) -> None:
        self.times: list[float] = []

    async def __call__(self) -> int:
        self.times.append(time.monotonic())
        return len(self.times)


async def test_an_accepted_first_answer_returns_at_once() -> None:
    """The first answer ``done`` accepts is returned without a pause (default: a true one)."""
    probe = Counter()
    async with asyncio.timeout(5):
        assert await poll_until(probe, within=60.0, every=60.0) == 1
    assert len(probe.times) == 1


async def test_polls_until_done_accepts() -> None:
    """Probes are repeated, ``every`` seconds apart, until ``done`` accepts an answer."""
    probe = Counter()
    async with asyncio.timeout(5):
        assert await poll_until(probe, done=lambda n: n == 4, within=60.0, every=0.02) == 4
    gaps = [b - a for a, b in zip(probe.times, probe.times[1:], strict=False)]
    assert len(gaps) == 3
    assert all(g >= 0.9 * 0.02 for g in gaps)


async def test_the_deadline_returns_the_last_answer_without_oversleeping() -> None:
    """At the deadline the last answer comes back unaccepted; no pause runs past it."""
    probe = Counter()
    started = time.monotonic()
    async with asyncio.timeout(5):
        last = await poll_until(probe, done=lambda n: False, within=0.2, every=30.0)
    took = time.monotonic() - started
    assert last == len(probe.times) == 2  # one at once, one at the deadline
    assert 0.2 <= took < 1.0


async def test_a_backoff_paces_the_probes() -> None:
    """With a Backoff the pauses between probes grow; ``within=None`` never gives up."""
    probe = Counter()
    async with asyncio.timeout(5):
        await poll_until(probe, done=lambda n: n == 4, within=None, every=Backoff(0.02, 0.08))
    gaps = [b - a for a, b in zip(probe.times, probe.times[1:], strict=False)]
    assert all(g >= 0.9 * low for g, low in zip(gaps, (0.02, 0.04, 0.08), strict=True))


async def test_cancellation_interrupts_the_pause() -> None:
    """Cancelling a poll ends it at once, mid-pause, with CancelledError."""
    await cancelled_at_once(poll_until(Counter(), done=lambda n: False, within=None, every=60.0))

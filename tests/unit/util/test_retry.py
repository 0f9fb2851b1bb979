"""The one retry helper: capped backoff with jitter, the transient predicate, the attempt
limit, the logging callback, cancellation."""

from __future__ import annotations

import time

import pytest
from tests.support.waits import cancelled_at_once

from traind.errors import StorageError, TransientStorageError
from traind.util.retry import Backoff, retrying, transient


def test_backoff_doubles_up_to_the_cap() -> None:
    """Without jitter the pause doubles from ``initial`` and never exceeds ``cap``."""
    b = Backoff(0.5, 3.0)
    assert [b.delay(n) for n in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert b.delay(10_000) == 3.0  # no overflow however many retries


def test_full_jitter_spans_initial_to_the_doubled_pause() -> None:
    """Full jitter draws from [initial, doubled pause]: never below ``initial``."""
    b = Backoff(0.2, 20.0, jitter=1.0)
    assert b.delay(3, rand=lambda: 0.0) == 0.2
    assert b.delay(3, rand=lambda: 0.999999) == pytest.approx(1.6, abs=1e-5)
    assert b.delay(40, rand=lambda: 0.999999) == pytest.approx(20.0, abs=1e-4)
    for n in range(12):
        assert 0.2 <= b.delay(n) <= min(20.0, 0.2 * 2**n)


def test_partial_jitter_keeps_the_upper_part() -> None:
    """A jitter of 0.25 spreads the pause over its top quarter only."""
    b = Backoff(1.0, 100.0, jitter=0.25)
    assert b.delay(3, rand=lambda: 0.0) == 6.0
    assert b.delay(3, rand=lambda: 0.5) == 7.0
    assert b.delay(0, rand=lambda: 0.0) == 1.0  # not below initial


def test_jitter_around_spreads_both_ways_below_the_cap() -> None:
    """``around`` spreads the pause ±jitter (below ``initial`` too), never above ``cap``."""
    b = Backoff(1.0, 10.0, jitter=0.2, around=True)
    assert b.delay(0, rand=lambda: 0.0) == pytest.approx(0.8)
    assert b.delay(2, rand=lambda: 0.5) == pytest.approx(4.0)
    assert b.delay(2, rand=lambda: 0.999999) == pytest.approx(4.8, rel=1e-5)
    assert b.delay(4, rand=lambda: 0.999999) == 10.0
    assert b.delay(40, rand=lambda: 0.0) == pytest.approx(8.0)


def test_cap_below_initial_waits_the_cap() -> None:
    """A cap below ``initial`` is the pause, jitter or not."""
    assert Backoff(2.0, 1.0, jitter=1.0).delay(0, rand=lambda: 0.7) == 1.0


def test_transient_predicate() -> None:
    """Only a TransientStorageError (its ``transient`` fact) is transient by default."""
    assert transient(TransientStorageError("x"))
    assert not transient(StorageError("x"))
    assert not transient(OSError("x"))


async def test_retries_transient_failures_then_succeeds() -> None:
    """Transient failures are retried, each reported with its attempt count and pause."""
    seen: list[tuple[str, int, float]] = []
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TransientStorageError(f"fail {calls}")
        return "ok"

    result = await retrying(attempt, Backoff(0.001, 0.002), 5,
                            on_retry=lambda e, n, d: seen.append((str(e), n, d)))
    assert result == "ok"
    assert seen == [("fail 1", 1, 0.001), ("fail 2", 2, 0.002)]


async def test_gives_up_after_retries() -> None:
    """After ``retries`` retries the last transient failure is raised as it is."""
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise TransientStorageError(f"fail {calls}")

    with pytest.raises(TransientStorageError, match="fail 3"):
        await retrying(attempt, Backoff(0.0, 0.0), 2)
    assert calls == 3


async def test_permanent_failure_is_raised_at_once() -> None:
    """A failure the predicate calls permanent is never retried."""
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise StorageError("denied")

    with pytest.raises(StorageError, match="denied"):
        await retrying(attempt, Backoff(0.0, 0.0), 5, on_retry=lambda *a: pytest.fail("retried"))
    assert calls == 1


async def test_custom_predicate_and_unbounded_retries() -> None:
    """``is_transient`` decides on any exception; ``retries=None`` retries until success."""
    calls = 0

    async def attempt() -> int:
        nonlocal calls
        calls += 1
        if calls < 20:
            raise ConnectionResetError
        return calls

    assert await retrying(attempt, Backoff(0.0, 0.0), None,
                          lambda e: isinstance(e, ConnectionError)) == 20


async def test_failed_before_waits_and_continues_the_backoff() -> None:
    """``failed`` failures reported elsewhere: the first attempt waits, the count goes on."""
    seen: list[tuple[int, float]] = []
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TransientStorageError("again")

    started = time.monotonic()
    await retrying(attempt, Backoff(0.05, 1.0), None, on_retry=lambda e, n, d: seen.append((n, d)),
                   failed=1)
    assert seen == [(2, 0.1)]
    assert time.monotonic() - started >= 0.15  # 0.05 before the first attempt, then 0.1


async def test_cancellation_interrupts_the_wait() -> None:
    """Cancelling a retrying call ends it at once, mid-pause, with CancelledError."""

    async def attempt() -> None:
        raise TransientStorageError("down")

    await cancelled_at_once(retrying(attempt, Backoff(60.0, 60.0), None))

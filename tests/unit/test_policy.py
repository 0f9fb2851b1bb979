"""The restart policy: backoff, the restart window, stable resets and the three policies."""

from __future__ import annotations

from typing import Any

import pytest

from traind.config import RestartConfig
from traind.supervisor.policy import (
    JITTER,
    History,
    RestartAction,
    Role,
    backoff,
    decide,
    is_failure,
)


def cfg(**kw: Any) -> RestartConfig:
    base: dict[str, Any] = {
        "policy": "on-failure",
        "backoff_initial": 1.0,
        "backoff_max": 10.0,
        "max_restarts": 3,
        "window": 100.0,
        "stable_after": 50.0,
    }
    return RestartConfig(**(base | kw))


def mid() -> float:
    return 0.5


@pytest.mark.parametrize(
    ("role", "code", "failed"),
    [
        (Role.TRAINER, 0, False),
        (Role.TRAINER, 1, True),
        (Role.TRAINER, -9, True),
        (Role.TRAINER, None, True),
        (Role.VLLM, 0, True),
        (Role.VLLM, 1, True),
        (Role.SERVICE, 0, True),
        (Role.SERVICE, -15, True),
    ],
)
def test_is_failure(role: Role, code: int | None, failed: bool) -> None:
    """Only the trainer's exit 0 is a success; vLLM and services failing includes exit 0."""
    assert is_failure(role, code) is failed


def test_backoff_doubles_then_caps() -> None:
    """Without jitter spread the delay doubles from backoff_initial up to backoff_max."""
    c = cfg()
    assert [backoff(c, n, 0.5) for n in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_backoff_jitter_bounds() -> None:
    """Jitter spreads the delay by ±JITTER and never exceeds backoff_max."""
    c = cfg()
    assert backoff(c, 1, 0.0) == pytest.approx(2.0 * (1 - JITTER))
    assert backoff(c, 1, 0.999999) == pytest.approx(2.0 * (1 + JITTER), rel=1e-5)
    assert backoff(c, 10, 0.999999) == 10.0
    assert backoff(c, 10_000, 0.0) == pytest.approx(10.0 * (1 - JITTER))


def test_backoff_huge_attempt_does_not_overflow() -> None:
    """A very long restart history does not overflow the exponent."""
    assert backoff(cfg(), 10**6, 0.5) == 10.0


def test_restart_on_failure_with_growing_delay() -> None:
    """Consecutive failures are restarted with a doubling delay and recorded in the history."""
    c, h, delays = cfg(), History(), []
    for i in range(3):
        d = decide(c, h, now=float(i), uptime=0.1, failed=True, jitter=mid)
        assert d.action is RestartAction.RESTART
        delays.append(d.delay)
        h = d.history
    assert delays == [1.0, 2.0, 4.0]
    assert h.restarts == (0.0, 1.0, 2.0)


def test_fatal_after_max_restarts_in_window() -> None:
    """The failure after max_restarts restarts inside the window is FATAL."""
    c = cfg(max_restarts=2)
    h = History((10.0, 20.0))
    d = decide(c, h, now=30.0, uptime=1.0, failed=True, jitter=mid)
    assert d.action is RestartAction.FATAL
    assert d.reason == "too_many_restarts"


def test_old_restarts_leave_the_window() -> None:
    """Restarts older than the window no longer count, nor raise the backoff exponent."""
    c = cfg(max_restarts=2, window=100.0)
    d = decide(c, History((0.0, 5.0)), now=104.0, uptime=1.0, failed=True, jitter=mid)
    assert d.action is RestartAction.RESTART
    assert d.history.restarts == (5.0, 104.0)
    assert d.delay == 2.0


def test_zero_max_restarts_is_fatal_at_once() -> None:
    """max_restarts = 0 turns the first failure into FATAL."""
    d = decide(cfg(max_restarts=0), History(), now=0.0, uptime=0.0, failed=True)
    assert d.action is RestartAction.FATAL


def test_stable_uptime_resets_history() -> None:
    """A run that lasted stable_after clears the counter: the next delay is backoff_initial."""
    c = cfg(max_restarts=2)
    full = History((1.0, 2.0))
    d = decide(c, full, now=60.0, uptime=50.0, failed=True, jitter=mid)
    assert d.action is RestartAction.RESTART
    assert d.delay == 1.0
    assert d.history.restarts == (60.0,)


def test_short_uptime_keeps_history() -> None:
    """A run shorter than stable_after keeps the counter."""
    d = decide(cfg(max_restarts=2), History((1.0, 2.0)), now=60.0, uptime=49.9, failed=True)
    assert d.action is RestartAction.FATAL


@pytest.mark.parametrize(
    ("policy", "failed", "action", "reason"),
    [
        ("always", True, RestartAction.RESTART, "failed"),
        ("always", False, RestartAction.RESTART, "always"),
        ("on-failure", True, RestartAction.RESTART, "failed"),
        ("on-failure", False, RestartAction.EXIT, "exited_cleanly"),
        ("never", True, RestartAction.EXIT, "policy_never"),
        ("never", False, RestartAction.EXIT, "exited_cleanly"),
    ],
)
def test_policies(policy: str, failed: bool, action: RestartAction, reason: str) -> None:
    """always restarts every exit, on-failure only failures, never nothing."""
    d = decide(cfg(policy=policy), History(), now=0.0, uptime=1.0, failed=failed, jitter=mid)
    assert (d.action, d.reason) == (action, reason)
    assert d.delay == (1.0 if action is RestartAction.RESTART else 0.0)


def test_exit_keeps_history_untouched() -> None:
    """A clean exit records no restart."""
    h = History((3.0,))
    d = decide(cfg(), h, now=4.0, uptime=1.0, failed=False)
    assert d.history == h


def test_jitter_is_injected() -> None:
    """The jitter source is called once per restart and shapes the delay."""
    calls: list[int] = []

    def low() -> float:
        calls.append(1)
        return 0.0

    d = decide(cfg(), History(), now=0.0, uptime=0.0, failed=True, jitter=low)
    assert calls == [1]
    assert d.delay == pytest.approx(1.0 - JITTER)

"""Restart policy: whether, and how soon, a child that stopped is started again.

Pure functions of the config, the restart history and the clock; no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from traind.config import RestartConfig
from traind.util.retry import Backoff

JITTER = 0.2
"""Backoff delays are spread uniformly over ±20% so restarted children do not move in step."""


class Role(StrEnum):
    """What a child is for; it decides what an exit means and which environment it gets."""

    SERVICE = "service"
    VLLM = "vllm"
    TRAINER = "trainer"


class RestartAction(StrEnum):
    """What to do after a child stopped."""

    RESTART = "restart"
    EXIT = "exit"
    FATAL = "fatal"


@dataclass(frozen=True)
class History:
    """Times (monotonic seconds) of the restarts that count against ``max_restarts``."""

    restarts: tuple[float, ...] = ()


@dataclass(frozen=True)
class RestartDecision:
    """The policy's answer: the action, the backoff delay before a restart, the new history."""

    action: RestartAction
    reason: str
    history: History
    delay: float = 0.0


def is_failure(role: Role, returncode: int | None) -> bool:
    """Any exit of vLLM or a service is a failure (vLLM exits 0 after its engine died);
    only the trainer's exit 0 is a success: training finished."""
    return role is not Role.TRAINER or returncode != 0


def backoff(config: RestartConfig, attempt: int, jitter: float) -> float:
    """Delay before restart number ``attempt`` (0-based): doubling from ``backoff_initial``,
    spread ±JITTER by ``jitter`` drawn from [0, 1), never above ``backoff_max``."""
    spaced = Backoff(config.backoff_initial, config.backoff_max, JITTER, around=True)
    return spaced.delay(attempt, lambda: jitter)


def decide(
    config: RestartConfig,
    history: History,
    *,
    now: float,
    uptime: float,
    failed: bool,
    jitter: Callable[[], float] = random.random,
) -> RestartDecision:
    """Decide what follows a stop after ``uptime`` seconds of running.

    A run that lasted ``stable_after`` clears the history. ``always`` restarts clean exits too;
    ``on-failure`` only failures; ``never`` nothing. More than ``max_restarts`` restarts within
    ``window`` seconds is FATAL.
    """
    if uptime >= config.stable_after:
        history = History()
    if not failed and config.policy != "always":
        return RestartDecision(RestartAction.EXIT, "exited_cleanly", history)
    if config.policy == "never":
        return RestartDecision(RestartAction.EXIT, "policy_never", history)
    recent = tuple(t for t in history.restarts if now - t < config.window)
    if len(recent) >= config.max_restarts:
        return RestartDecision(RestartAction.FATAL, "too_many_restarts", History(recent))
    delay = backoff(config, len(recent), jitter())
    reason = "failed" if failed else "always"
    return RestartDecision(RestartAction.RESTART, reason, History((*recent, now)), delay)

"""A vLLM server that answers /health but generates nothing: read from its /metrics.

vLLM's /health only asks whether the engine process is alive, so an engine stuck in its busy
loop (vllm#39863) stays 200. Its Prometheus counters tell: requests running or waiting while
``vllm:generation_tokens_total`` does not move. An idle server generates nothing either and is
never a hang. Pure functions; the caller fetches /metrics and keeps the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class Load:
    """What the engine has to do and has done, summed over engines and models."""

    running: float
    waiting: float
    generated: float

    @property
    def busy(self) -> bool:
        """True while any request is running or waiting."""
        return self.running + self.waiting > 0


@dataclass(frozen=True)
class Stall:
    """Since when (monotonic seconds) a busy server has generated no token."""

    since: float
    generated: float


def parse_load(text: str) -> Load | None:
    """The three series from Prometheus text, or None when the generated-token counter is
    absent (not vLLM, or no engine yet)."""
    sums = {RUNNING: 0.0, WAITING: 0.0, GENERATED: 0.0}
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in sums:
            continue
        try:
            sums[name] += float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        seen = seen or name == GENERATED
    return Load(sums[RUNNING], sums[WAITING], sums[GENERATED]) if seen else None


def observe(stall: Stall | None, load: Load, now: float) -> Stall | None:
    """The stall after one reading: None while idle, restarted whenever a token was
    generated, kept while a busy server's counter stands still."""
    if not load.busy:
        return None
    if stall is None or load.generated != stall.generated:
        return Stall(now, load.generated)
    return stall


def is_hung(stall: Stall | None, now: float, limit: float) -> bool:
    """True once a busy server has generated nothing for ``limit`` seconds."""
    return stall is not None and now - stall.since >= limit

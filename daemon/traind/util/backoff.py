"""Capped exponential backoff: the one formula every retry loop in traind waits by."""

from __future__ import annotations


def doubling(retry: int, initial: float, cap: float) -> float:
    """Seconds before retry number ``retry`` (0-based): ``initial``, doubled for each retry
    before it, never above ``cap``."""
    return min(cap, initial * 2.0 ** min(retry, 64))

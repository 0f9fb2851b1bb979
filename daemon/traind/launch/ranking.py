"""Offer filtering and ranking: pure functions, the same for every backend.

GPU names match in any spelling ("RTX 4090", "rtx_4090", "RTX-4090"). A family name also
matches its variants: "H100" matches "H100 SXM" and "H100 NVL", but "RTX 409" does not match
"RTX 4090" (a name never matches a longer model number).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from traind.launch.base import Constraints, Offer


def normalise_gpu(name: str) -> str:
    """``"RTX 4090"`` → ``"rtx4090"``: lowercase, without spaces, ``_`` or ``-``."""
    return re.sub(r"[\s_\-]+", "", name).lower()


def gpu_matches(offered: str, wanted: str) -> bool:
    """Whether the offered model is the wanted one or a variant of it."""
    have, want = normalise_gpu(offered), normalise_gpu(wanted)
    if not want or not have.startswith(want):
        return False
    rest = have[len(want):]
    return not rest or not rest[0].isdigit()


def rejection(offer: Offer, c: Constraints) -> str | None:
    """Why ``offer`` does not satisfy ``c`` (the first reason), or None when it does."""
    if c.gpu and not any(gpu_matches(offer.gpu_name, g) for g in c.gpu):
        return "gpu model"
    checks = (
        (offer.num_gpus < c.num_gpus, "gpu count"),
        (offer.gpu_ram_gb < c.min_gpu_ram_gb, "gpu memory"),
        (offer.disk_gb < c.min_disk_gb, "disk"),
        (offer.download_mbps < c.min_download_mbps, "download bandwidth"),
        (offer.reliability < c.min_reliability, "reliability"),
        (
            offer.max_duration_hours is not None and offer.max_duration_hours < c.duration_hours,
            "rental duration",
        ),
        (
            c.max_price_per_hour is not None and offer.price_per_hour > c.max_price_per_hour,
            "price cap",
        ),
    )
    return next((reason for failed, reason in checks if failed), None)


def sort_key(offer: Offer) -> tuple[float, float, float, str]:
    """Cheapest first; on a tie the more reliable, then the faster download, then by id."""
    return (offer.price_per_hour, -offer.reliability, -offer.download_mbps, offer.id)


def rank(offers: Iterable[Offer], c: Constraints) -> list[Offer]:
    """The offers that satisfy ``c``, best first."""
    return sorted((o for o in offers if rejection(o, c) is None), key=sort_key)


def explain(offers: Iterable[Offer], c: Constraints) -> str:
    """A one-line account of why offers were rejected, e.g. ``"3 price cap, 1 disk"``."""
    reasons = Counter(r for o in offers if (r := rejection(o, c)) is not None)
    return ", ".join(f"{n} {reason}" for reason, n in reasons.most_common()) or "none offered"

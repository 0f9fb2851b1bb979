"""The claim keeper's between-files claim check never renews twice at once, however slow
the store's renewal is and however many files finish meanwhile."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from traind.checkpoints.commit import claims as keeper

from traind.layout.manifest import Writer
from traind.protocol import CheckpointStore


class SlowRenewals:
    """A store whose renewal takes longer than the checks' spacing; counts overlaps."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.renewals = 0

    async def renew(self, tag: str, writer: object) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.2)
        finally:
            self.running -= 1
            self.renewals += 1


def test_renewals_of_a_slow_store_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files finishing every 10 ms while a renewal takes 200 ms (checks due every 20 ms):
    one renewal at a time (two racing compare-and-swaps would fail one as 'changed while
    renewed' and stop the upload), and renewals still happen."""
    monkeypatch.setattr(keeper, "CLAIM_CHECK_EVERY", 0.02)
    store = SlowRenewals()
    claims = keeper.ClaimKeeper(lambda: cast(CheckpointStore, store), 600.0)
    check = claims.still_ours("checkpoint-1", Writer("a" * 32, "host"))

    async def main() -> None:
        async def file_finishes(delay: float) -> None:
            await asyncio.sleep(delay)
            await check()

        await asyncio.wait_for(
            asyncio.gather(*(file_finishes(i * 0.01) for i in range(60))), 30)

    asyncio.run(main())
    assert store.most == 1, f"{store.most} renewals at once"
    assert store.renewals >= 2

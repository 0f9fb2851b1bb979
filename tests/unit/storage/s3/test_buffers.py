"""The S3 buffer pool is bounded by bytes: many small buffers fit where a few parts would,
requests are granted first come first served, and a cancelled request gives back nothing
it did not get."""

from __future__ import annotations

import asyncio
import resource

from traind.storage.s3.buffers import BufferPool

KIB = 1024
MIB = 1024 * KIB


def test_small_buffers_fill_the_byte_budget_and_no_more() -> None:
    """A 1 MiB budget hands out sixteen 64 KiB buffers at once; the seventeenth waits until
    one is given back, and gets that one again rather than a new map."""

    async def main() -> None:
        pool = BufferPool(MIB)
        held = [await asyncio.wait_for(pool.acquire(64 * KIB), 5) for _ in range(16)]
        late = asyncio.create_task(pool.acquire(64 * KIB))
        await asyncio.sleep(0.05)
        assert not late.done()
        pool.release(held[0])
        assert await asyncio.wait_for(late, 5) is held[0]

    asyncio.run(main())


def test_a_part_waits_for_room_and_is_not_overtaken() -> None:
    """A request for a part waits until its bytes are free; small requests after it wait
    behind it (first come, first served), so parts are never starved by small files."""

    async def main() -> None:
        pool = BufferPool(8 * MIB)
        small = await pool.acquire(MIB)
        part = asyncio.create_task(pool.acquire(8 * MIB))
        await asyncio.sleep(0.01)
        after = asyncio.create_task(pool.acquire(MIB))
        await asyncio.sleep(0.05)
        assert not part.done()
        assert not after.done()
        pool.release(small)
        big = await asyncio.wait_for(part, 5)
        assert len(big) >= 8 * MIB
        assert not after.done()
        pool.release(big)
        pool.release(await asyncio.wait_for(after, 5))

    asyncio.run(main())


def test_a_buffer_larger_than_the_budget_is_given_alone() -> None:
    """A request larger than the whole budget is granted once nothing else is out."""

    async def main() -> None:
        pool = BufferPool(MIB)
        pool.release(await asyncio.wait_for(pool.acquire(4 * MIB), 5))
        first = await pool.acquire(KIB)
        big = asyncio.create_task(pool.acquire(4 * MIB))
        await asyncio.sleep(0.05)
        assert not big.done()
        pool.release(first)
        assert len(await asyncio.wait_for(big, 5)) >= 4 * MIB

    asyncio.run(main())


def test_a_cancelled_request_frees_its_place() -> None:
    """Cancelling a waiting request leaves the budget as it was: the next request is
    granted as soon as the bytes it needs are given back."""

    async def main() -> None:
        pool = BufferPool(MIB)
        held = await pool.acquire(MIB)
        gone = asyncio.create_task(pool.acquire(MIB))
        await asyncio.sleep(0.01)
        gone.cancel()
        nxt = asyncio.create_task(pool.acquire(MIB))
        await asyncio.sleep(0.01)
        pool.release(held)
        await asyncio.wait_for(nxt, 5)
        assert gone.cancelled()

    asyncio.run(main())


def test_a_new_buffer_is_filled_without_page_faults() -> None:
    """A buffer the pool makes is private memory whose pages are already in place: filling
    it faults no page in (a default, shmem-backed map faults once per 4 KiB page)."""

    async def main() -> None:
        pool = BufferPool(8 * MIB)
        buf = await asyncio.wait_for(pool.acquire(8 * MIB), 5)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for offset in range(0, len(buf), 4 * KIB):
            buf[offset] = 1
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
        assert faults < 64, f"{faults} page faults filling {len(buf) // (4 * KIB)} pages"
        pool.release(buf)

    asyncio.run(main())

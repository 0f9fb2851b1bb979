"""What a multi-node commit asks of S3, counted by a real proxy in front of SeaweedFS per
host: a host whose part waits makes the same few requests however many hosts the job has;
only the host completing the set reads the N part manifests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from tests.integration.s3.conftest import s3_config
from tests.support.s3proxy import ThrottlingProxy, throttling_proxy
from tests.support.seaweed import SeaweedS3
from traind.checkpoints.commit.lifecycle import PartsPendingError
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal

from traind.config import S3Storage
from traind.protocol import CheckpointStore
from traind.util.nodes import NodeRank

TAG = "checkpoint-4"
NODES = 3


def listings(proxy: ThrottlingProxy) -> int:
    return sum("list-type" in r for r in proxy.requests)


async def test_waiting_hosts_requests_do_not_grow_with_the_job(
    s3_server: SeaweedS3, bucket: str, backends: Callable[[S3Storage], CheckpointStore],
    tmp_path: Path,
) -> None:
    """Three hosts, each with its own DCP file and the same config.json: every waiting host
    makes 9 requests (claim 2, listing 1, two files 2, the part's files listed 1, part 1,
    part names 1, the committed manifest read 1), as many where config.json is stored
    already (one read to compare it instead of its upload); node 0, completing the set,
    writes the manifest instead of reading it, lists once more, reads the N parts and lists
    the checkpoint's files before its manifest: 9 + 1 + N + 1."""
    journals: list[Journal] = []
    async with contextlib.AsyncExitStack() as stack:
        proxies, streamers = [], []
        for rank in range(NODES):
            proxy = await stack.enter_async_context(throttling_proxy(s3_server.endpoint))
            backend = backends(s3_config(s3_server, bucket, endpoint_url=proxy.endpoint))
            src = tmp_path / f"out{rank}" / TAG
            src.mkdir(parents=True)
            (src / f"__{rank}_0.distcp").write_bytes(b"x" * (rank + 1))
            (src / "config.json").write_bytes(b"{}")
            journals.append(Journal(tmp_path / f"state{rank}" / "journal.sqlite3",
                                    RunIdentity("run1", src.parent, backend.describe)))
            streamer = Streamer("run1", tmp_path / f"state{rank}", backend, journals[-1],
                                node=NodeRank(rank, NODES, "test"))
            await streamer.stage(TAG, 4, src)
            async with asyncio.timeout(30):
                await backend.probe()  # once per daemon: the conditional-write probe
            proxy.requests.clear()
            proxies.append(proxy)
            streamers.append(streamer)
        try:
            async with asyncio.timeout(90):
                for streamer in streamers[1:]:
                    with contextlib.suppress(PartsPendingError):
                        await streamer.commit(TAG)
                committed = await streamers[0].commit(TAG)
                for streamer in streamers[1:]:
                    assert await streamer.commit(TAG) == committed
        finally:
            for journal in journals:
                journal.close()
    waiting = [len(p.requests) for p in proxies[1:]]
    compared = [any("config.json" in r and r.startswith("GET") for r in p.requests)
                for p in proxies[1:]]
    assert waiting == [9] * (NODES - 1), [p.requests for p in proxies[1:]]
    assert compared == [False] + [True] * (NODES - 2)  # read to compare, not sent
    assert all(listings(p) == 3 for p in proxies[1:])
    parts_read = [r for r in proxies[0].requests if r.startswith("GET") and "traind-part-" in r]
    assert len(parts_read) == NODES
    assert listings(proxies[0]) == 5
    assert len(proxies[0].requests) == 9 + 1 + NODES + 1, proxies[0].requests

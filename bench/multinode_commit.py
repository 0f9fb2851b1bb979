"""Benchmark multi-node parts: commit latency after the last part, and two hosts' upload
rates against one host alone, on a local directory, S3 (SeaweedFS on loopback) or SSH
(sshd on loopback).

    python bench/multinode_commit.py [--store local|s3|ssh] [--size 512MiB] [--dir PATH]

Each simulated host (its own state_dir and journal, one store) holds its own data file of
``--size`` plus the same small ``config.json``, as node R of a DCP job does. Latency is from
the last host's part manifest written to the union manifest committed (the parts listing,
the union and the store's exclusive create). Rates: one host (run.nodes = 1) committing its
checkpoint alone, then two hosts storing their parts at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, running_seaweed
from tests.support.sshd import HOST, SSHServer
from traind.checkpoints.commit.streamer import PartsPendingError, Streamer
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal

from traind.config import LocalStorage, S3Storage, SSHStorage
from traind.layout.manifest import Manifest
from traind.layout.parts import Part
from traind.protocol import open_storage
from traind.util.nodes import NodeRank
from traind.util.units import parse_size

TAG = "checkpoint-1"


def make_part(root: Path, rank: int, size: int) -> Path:
    src = root / TAG
    src.mkdir(parents=True)
    with open(src / f"__{rank}_0.distcp", "wb") as f:
        left = size
        while left > 0:
            n = min(64 * 1024 * 1024, left)
            f.write(os.urandom(n))
            left -= n
    (src / "config.json").write_text('{"step": 1}')
    return src


class Timed:
    """A backend, noting when each part manifest and the union were written."""

    def __init__(self, backend: Any, marks: dict[str, float]) -> None:
        self._backend = backend
        self.marks = marks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def commit_part(self, part: Part) -> None:
        await self._backend.commit_part(part)
        self.marks[f"part-{part.node_rank}"] = time.perf_counter()

    async def commit(self, manifest: Manifest) -> None:
        await self._backend.commit(manifest)
        self.marks.setdefault("union", time.perf_counter())


@contextlib.contextmanager
def store(kind: str, work: Path) -> Iterator[LocalStorage | S3Storage | SSHStorage]:
    """The config of a fresh ``kind`` store, its server (if any) running for the block."""
    if kind == "local":
        yield LocalStorage(path=work / "store")
    elif kind == "s3":
        with running_seaweed(shutil.which("weed") or "weed", work / "seaweed") as server:
            server.create_bucket("bench")
            yield S3Storage.model_validate({
                "type": "s3", "bucket": "bench", "endpoint_url": server.endpoint,
                "region": REGION, "addressing_style": "path", "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY})
    else:
        sshd = SSHServer(shutil.which("sshd") or "/usr/sbin/sshd", work / "sshd")
        sshd.start_sync()
        try:
            yield SSHStorage.model_validate({
                "type": "ssh", "host": HOST, "port": sshd.port, "user": sshd.user,
                "identity_file": sshd.user_key.path, "known_hosts": sshd.known_hosts,
                "remote_path": str(work / "remote")})
        finally:
            sshd.stop_sync()


async def host(config: LocalStorage | S3Storage | SSHStorage, run: str, state: Path,
               src: Path, node: NodeRank | None, marks: dict[str, float]) -> float:
    """Stage and commit ``src`` as one host; seconds its commit took (the upload)."""
    backend = open_storage(config, run)
    storage: Any = Timed(backend, marks)
    journal = Journal(state / "journal.sqlite3", RunIdentity(run, src.parent,
                                                             storage.describe))
    streamer = Streamer(run, state, storage, journal, node=node)
    assert await streamer.stage(TAG, 1, src) is StageResult.STAGED
    await journal.set_state(TAG, "ready")
    await backend.probe()  # connected, as a running daemon is
    started = time.perf_counter()
    with contextlib.suppress(PartsPendingError):  # the other host's part completes it
        await streamer.commit(TAG)
    elapsed = time.perf_counter() - started
    journal.close()
    await backend.aclose()
    return elapsed


async def run(work: Path, size: int, config: LocalStorage | S3Storage | SSHStorage) -> None:
    marks: dict[str, float] = {}
    alone = await host(config, "one", work / "one/h", make_part(work / "one/out", 0, size),
                       None, marks)
    srcs = [make_part(work / f"two/out{r}", r, size) for r in (0, 1)]
    marks.clear()
    started = time.perf_counter()
    both = await asyncio.gather(*(host(config, "two", work / f"two/h{r}", srcs[r],
                                       NodeRank(r, 2, "bench"), marks) for r in (0, 1)))
    wall = time.perf_counter() - started
    last_part = max(marks["part-0"], marks["part-1"])
    mb = size / 1e6
    print(f"one host alone:     {mb / alone:8.0f} MB/s ({alone:.2f} s)")
    print(f"two hosts at once:  {2 * mb / wall:8.0f} MB/s together, "
          + ", ".join(f"{mb / s:.0f}" for s in both) + " MB/s each")
    print(f"last part stored -> union committed: {(marks['union'] - last_part) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["local", "s3", "ssh"], default="local",
                        help="the store both hosts share (default local)")
    parser.add_argument("--size", default="512MiB", help="each host's data (default 512MiB)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traind-bench-", dir=args.dir)).resolve()
    try:
        with store(args.store, work) as config:
            asyncio.run(run(work, parse_size(args.size), config))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

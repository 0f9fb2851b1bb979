"""Benchmark multi-node parts on the local backend: commit latency after the last part,
and two hosts' upload rates against one host alone.

    python bench/multinode_commit.py [--size 512MiB] [--dir /path/on/the/disk/to/test]

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traind.checkpoints.identity import RunIdentity
from traind.checkpoints.journal import Journal
from traind.checkpoints.streamer import PartsPendingError, Streamer
from traind.checkpoints.watcher import StageResult
from traind.config import LocalStorage
from traind.layout.manifest import Manifest
from traind.layout.parts import Part
from traind.nodes import NodeRank
from traind.storage.local import LocalBackend
from traind.units import parse_size

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


class Timed(LocalBackend):
    """The local backend, noting when each part manifest and the union were written."""

    def __init__(self, config: LocalStorage, marks: dict[str, float]) -> None:
        super().__init__(config, "bench")
        self.marks = marks

    async def commit_part(self, part: Part) -> None:
        await super().commit_part(part)
        self.marks[f"part-{part.node_rank}"] = time.perf_counter()

    async def commit(self, manifest: Manifest) -> None:
        await super().commit(manifest)
        self.marks.setdefault("union", time.perf_counter())


async def host(work: Path, name: str, src: Path, node: NodeRank | None,
               marks: dict[str, float]) -> float:
    """Stage and commit ``src`` as one host; seconds its commit took (the upload)."""
    storage = Timed(LocalStorage(path=work / "store"), marks)
    journal = Journal(work / name / "journal.sqlite3", RunIdentity("bench", src.parent,
                                                                   storage.describe))
    streamer = Streamer("bench", work / name, storage, journal, node=node)
    assert await streamer.stage(TAG, 1, src) is StageResult.STAGED
    await journal.set_state(TAG, "ready")
    started = time.perf_counter()
    with contextlib.suppress(PartsPendingError):  # the other host's part completes it
        await streamer.commit(TAG)
    elapsed = time.perf_counter() - started
    journal.close()
    return elapsed


async def run(work: Path, size: int) -> None:
    marks: dict[str, float] = {}
    alone = await host(work / "one", "h", make_part(work / "one/out", 0, size), None, marks)
    srcs = [make_part(work / f"two/out{r}", r, size) for r in (0, 1)]
    marks.clear()
    started = time.perf_counter()
    both = await asyncio.gather(*(host(work / "two", f"h{r}", srcs[r], NodeRank(r, 2, "bench"),
                                       marks) for r in (0, 1)))
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
    parser.add_argument("--size", default="512MiB", help="each host's data (default 512MiB)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traind-bench-", dir=args.dir)).resolve()
    try:
        asyncio.run(run(work, parse_size(args.size)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark the local backend: commit throughput vs ``cp -r``, and detection latency.

    python bench/local_commit.py [--size 1GiB] [--dir /path/on/the/disk/to/test]

Commit: the same synthetic checkpoint (two large incompressible files plus the small
json/pt files a transformers checkpoint has) is copied by ``cp -r`` (+ ``sync``, since traind
fsyncs every file) and committed by traind's local backend with sha256 computed in the same
pass. Detection: ``traind run`` watches an output_dir while checkpoints are written; latency
is marker written → snapshot taken, from the daemon's own ``checkpoint_staged`` events,
with inotify and with polling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.daemon import DaemonProcess, write_config
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal

from traind.config import LocalStorage

try:
    from traind.protocol import open_storage
except ImportError:  # a checkout from before the store protocol (--against)
    from traind.storage import open_storage  # type: ignore[attr-defined,no-redef]
from traind.util.units import parse_size


def make_checkpoint(root: Path, size: int) -> None:
    root.mkdir(parents=True)
    chunk = 64 * 1024 * 1024
    for i in range(2):
        with open(root / f"model-0000{i + 1}-of-00002.safetensors", "wb") as f:
            left = size // 2
            while left > 0:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
    for name, n in [
        ("optimizer.pt", 4096),
        ("scheduler.pt", 1064),
        ("rng_state.pth", 14244),
        ("config.json", 700),
        ("trainer_state.json", 900),
    ]:
        (root / name).write_bytes(os.urandom(n))


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


async def traind_commit(src: Path, work: Path) -> float:
    storage = open_storage(LocalStorage(path=work / "store"), "bench")
    run = RunIdentity("bench", src.parent, storage.describe)
    journal = Journal(work / "state/journal.sqlite3", run)
    streamer = Streamer("bench", work / "state", storage, journal)
    started = time.perf_counter()
    assert await streamer.stage(src.name, 1, src) is StageResult.STAGED
    await journal.set_state(src.name, "ready")
    await streamer.commit(src.name)
    elapsed = time.perf_counter() - started
    journal.close()
    return elapsed


def detection(work: Path, polling: bool, n: int = 8) -> list[float]:
    out = work / f"det-{polling}"
    out.mkdir()
    cfg = write_config(
        work / f"det-{polling}.toml",
        run="det",
        output_dir=out,
        state_dir=work / f"dst-{polling}",
        storage=f'type = "local"\npath = "{work}/det-store-{polling}"',
    )
    if polling:
        cfg.write_text(
            cfg.read_text().replace(
                'poll_interval = "200ms"', 'poll_interval = "200ms"\nforce_polling = true'
            )
        )
    daemon = DaemonProcess(cfg, env={"TRAIND_CHECKPOINTS__SETTLE": "0.2s"})
    try:
        daemon.wait_for("daemon_ready", timeout=30)
        for step in range(1, n + 1):
            d = out / f"checkpoint-{step}"
            d.mkdir()
            (d / "model.bin").write_bytes(os.urandom(1 << 20))
            (d / "trainer_state.json").write_text("{}")
            daemon.wait_for(
                lambda e, t=d.name: e.get("event") == "checkpoint_staged" and e["tag"] == t,
                timeout=30,
            )
            time.sleep(0.3)
        return [e["since_last_write"] for e in daemon.named("checkpoint_staged")]
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="1GiB", help="checkpoint size (default 1GiB)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    args = parser.parse_args()
    size = parse_size(args.size)
    # Absolute: traind's config takes only absolute directories (a relative --dir is fine).
    work = Path(tempfile.mkdtemp(prefix="traind-bench-", dir=args.dir)).resolve()
    try:
        src = work / "checkpoint-1"
        make_checkpoint(src, size)
        total = sum(p.stat().st_size for p in src.iterdir())
        rows = []
        cp = timed(lambda: subprocess.run(["cp", "-r", src, work / "cp1"], check=True))
        rows.append(("cp -r", cp))
        cps = timed(
            lambda: subprocess.run(["sh", "-c", f"cp -r '{src}' '{work}/cp2' && sync"], check=True)
        )
        rows.append(("cp -r && sync", cps))
        rows.append(("traind commit (sha256, fsync)", asyncio.run(traind_commit(src, work))))
        print(
            f"\ncommit of a {total / 2**30:.2f} GiB checkpoint ({len(list(src.iterdir()))} files)"
        )
        print(f"{'tool':32} {'seconds':>8} {'MB/s':>8}")
        for name, secs in rows:
            print(f"{name:32} {secs:8.2f} {total / 1e6 / secs:8.0f}")
        for polling in (False, True):
            lat = detection(work, polling)
            mode = "polling" if polling else "inotify"
            print(
                f"detection latency ({mode}, n={len(lat)}): "
                f"median {statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Time to safe as a user feels it: from the trainer's save returning to the checkpoint
committed in the store, for each store and checkpoint size, with and without the marker.

A real ``traind run`` watches an output_dir; this script plays the trainer: it writes a
checkpoint (large incompressible shards, then the small json files with
``trainer_state.json`` last, as transformers saves), and with ``--marker`` modes also the
``.traind-complete`` marker ``TraindCallback`` writes once a save returns. Without it the
daemon commits once the directory has been quiet for ``settle`` (the config's default). The
clock starts when the save returns and stops at the daemon's ``checkpoint_committed``
event; the daemon's own figure for the same checkpoint (newest write → commit, the
``traind_save_to_safe_seconds`` histogram and the status timeline) is shown beside it.
Stores: a local directory, SeaweedFS (``weed mini``) over S3, and a loopback OpenSSH sshd
(``transfer = "openssh"``), each on this machine.

    python bench/time_to_safe.py --sizes 1GiB,10GiB --stores local,s3,ssh
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.daemon import (  # noqa: E402
    TESTS_NICE,
    DaemonProcess,
    is_event,
    write_config,
)
from tests.support.seaweed import running_seaweed  # noqa: E402
from tests.support.sshd import HOST, SSHServer  # noqa: E402

from traind.layout.markers import EXPLICIT_MARKER  # noqa: E402
from traind.status.client import fetch_status  # noqa: E402
from traind.util.units import format_size, parse_size  # noqa: E402

BLOCK = 64 * 1024**2
SHARD = 2 * 1024**3
"""The largest shard a save writes (safetensors shards of a few GiB)."""


@dataclass(frozen=True)
class Store:
    """A running store: its ``[storage]`` TOML, and how to empty it between checkpoints."""

    name: str
    toml: str
    root: Path | None  # where a local or SSH store keeps its files; None for S3
    bucket_client: Any = None
    server: int | None = None  # the server's pid (sshd, weed), if it has one

    def empty(self) -> None:
        """Remove every stored checkpoint (the next one then needs the same space)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        client = self.bucket_client
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="ckpts"):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket="ckpts", Delete={"Objects": keys})


@contextlib.contextmanager
def running_store(kind: str, work: Path) -> Iterator[Store]:
    """Start the store ``kind`` (local, s3, ssh) under ``work`` for the block."""
    if kind == "local":
        yield Store("local", f'type = "local"\npath = "{work / "store"}"', work / "store")
    elif kind == "s3":
        with running_seaweed(shutil.which("weed") or "weed", work / "seaweed") as server:
            client = server.client()
            client.create_bucket(Bucket="ckpts")
            yield Store("s3 (SeaweedFS)", server.storage_toml(), None, client,
                        server.proc.pid if server.proc else None)
    elif kind == "ssh":
        sshd = SSHServer(shutil.which("sshd") or "/usr/sbin/sshd", work / "sshd")
        sshd.start_sync()
        try:
            yield Store("ssh (openssh)", (
                f'type = "ssh"\nhost = "{HOST}"\nport = {sshd.port}\n'
                f'user = "{sshd.user}"\nidentity_file = "{sshd.user_key.path}"\n'
                f'known_hosts = "{sshd.known_hosts}"\nremote_path = "{work / "remote"}"\n'
                'transfer = "openssh"\n'
            ), work / "remote", server=sshd.pid)
        finally:
            sshd.stop_sync()
    else:
        raise ValueError(f"unknown store {kind!r}")


def start_daemon(work: Path, store: Store, extra: str = "", run_keys: str = "",
                 limit: Callable[[int], None] = lambda pgid: None) -> tuple[DaemonProcess, Path]:
    """``traind run`` watching a new output_dir under ``work`` and storing to ``store``
    (``settle`` and ``transfer_nice`` the config's defaults; ``run_keys`` lines added to
    ``[run]``), once it
    is ready, and that output_dir; ``limit(pgid)`` is applied to its process group first (a
    priority, a cgroup)."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(work / "state", ignore_errors=True)
    out.mkdir(parents=True)
    cfg = write_config(work / "traind.toml", run="bench", output_dir=out,
                       state_dir=work / "state", storage=store.toml, extra=extra)
    cfg.write_text(cfg.read_text().replace('settle = "1s"\n', "").replace(TESTS_NICE, "")
                   .replace("[checkpoints]\n", f"{run_keys}\n[checkpoints]\n"))
    daemon = DaemonProcess(cfg)
    limit(daemon.proc.pid)
    daemon.wait_for("daemon_ready", timeout=60)
    return daemon, out


def save(out: Path, step: int, size: int, marker: bool) -> tuple[Path, float]:
    """Write ``checkpoint-<step>`` of ``size`` bytes as a trainer's save does (shards of at
    most ``SHARD``, then the json files, trainer_state.json last; then the marker if asked);
    return it and the time (``time.time()``) the save returned."""
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir()
    block = os.urandom(BLOCK)
    shards = max(1, -(-size // SHARD))
    for n in range(shards):
        left = size // shards
        with open(ckpt / f"model-{n + 1:05d}-of-{shards:05d}.safetensors", "wb") as f:
            while left:
                left -= f.write(block[: min(left, BLOCK)])
    for name in ("config.json", "generation_config.json", "trainer_state.json"):
        (ckpt / name).write_text(f'{{"global_step": {step}}}')
    if marker:
        (ckpt / EXPLICIT_MARKER).write_text("")
    return ckpt, time.time()


def committed_at(daemon: DaemonProcess, tag: str, timeout: float) -> float:
    """When (``time.time()``) the daemon logged ``tag`` committed."""
    event = daemon.wait_for(is_event("checkpoint_committed", tag=tag), timeout=timeout)
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def daemon_safe_seconds(daemon: DaemonProcess, tag: str) -> float | None:
    """The daemon's own written → safe seconds for ``tag``, from its status timeline."""
    listen = daemon.config.read_text().split('listen = "')[1].split('"')[0]
    for entry in fetch_status(listen)["timeline"]:
        if entry["tag"] == tag:
            return entry["safe_seconds"]
    return None


@dataclass(frozen=True)
class Row:
    """One checkpoint's time to safe."""

    store: str
    size: int
    marker: bool
    seconds: float
    daemon_seconds: float | None


def measure(kind: str, sizes: list[int], repeat: int, work: Path, timeout: float) -> list[Row]:
    """Every size, with and without the marker, ``repeat`` times each, on one store."""
    rows = []
    with running_store(kind, work) as store:
        daemon, out = start_daemon(work, store)
        try:
            step = 0
            for size in sizes:
                for marker in (True, False):
                    for _ in range(repeat):
                        step += 1
                        ckpt, returned = save(out, step, size, marker)
                        seconds = committed_at(daemon, ckpt.name, timeout) - returned
                        rows.append(Row(store.name, size, marker, seconds,
                                        daemon_safe_seconds(daemon, ckpt.name)))
                        print(f"  {store.name:16s} {format_size(size):>9s} "
                              f"{'marker' if marker else 'settle':6s} {seconds:7.2f} s",
                              flush=True)
                        shutil.rmtree(ckpt)  # the trainer rotates it; the store is emptied
                        store.empty()
        finally:
            daemon.stop()
    return rows


def print_table(rows: list[Row], settle: float) -> None:
    """Median seconds from save returned to committed, per store, size and mode."""
    print(f"\nsave returned → checkpoint committed, seconds (median of the runs; the daemon's "
          f"own newest write → commit in brackets); settle = {settle:g} s\n")
    print("| store            |      size | with marker | settle (no marker) |")
    print("|------------------|----------:|------------:|-------------------:|")
    cells: dict[tuple[str, int], dict[bool, list[Row]]] = {}
    for r in rows:
        cells.setdefault((r.store, r.size), {}).setdefault(r.marker, []).append(r)
    for (store, size), modes in cells.items():
        shown = []
        for marker in (True, False):
            runs = modes.get(marker, [])
            if not runs:
                shown.append("-")
                continue
            ours = statistics.median(r.seconds for r in runs)
            theirs = [r.daemon_seconds for r in runs if r.daemon_seconds is not None]
            extra = f" ({statistics.median(theirs):.2f})" if theirs else ""
            shown.append(f"{ours:.2f}{extra}")
        print(f"| {store:16s} | {format_size(size):>9s} | {shown[0]:>11s} | {shown[1]:>18s} |")


def main() -> None:
    """Parse the command line and run every store."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1GiB,10GiB",
                        help="checkpoint sizes, comma-separated (default 1GiB,10GiB)")
    parser.add_argument("--stores", default="local,s3,ssh", help="default local,s3,ssh")
    parser.add_argument("--repeat", type=int, default=1, help="checkpoints per cell")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per checkpoint")
    parser.add_argument("--workdir", default=None, help="where to put the data (default: tmp)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    free = shutil.disk_usage(args.workdir or tempfile.gettempdir()).free
    if 2 * max(sizes) + 2 * 1024**3 > free:  # the save, and the store's copy of it
        raise SystemExit(f"{format_size(max(sizes))} needs {format_size(2 * max(sizes))} "
                         f"free; {format_size(free)} is: pass smaller --sizes")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="traind-safe-") as tmp:
        for kind in args.stores.split(","):
            rows += measure(kind, sizes, args.repeat, Path(tmp) / kind, args.timeout)
    print_table(rows, 5.0)


if __name__ == "__main__":
    main()

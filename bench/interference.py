"""What traind's streaming costs the trainer beside it, and what the trainer costs the upload.

A stand-in trainer (a torch matmul loop on ``--threads`` threads, printing its steps every
second) runs alone, then while a real ``traind run`` streams a checkpoint (default 4 GiB) to
each store: a local directory, SeaweedFS over S3, a loopback sshd (``transfer =
"openssh"``). Each store is measured at traind's defaults (the transfers at ``[run]
transfer_nice = 10`` below the daemon), with ``transfer_nice = 0`` (every thread at the
daemon's priority, as before it existed), and at the unit's lines for a busy host, applied
to the daemon's process group as systemd would: ``Nice=`` (``setpriority``),
``IOSchedulingClass=``/``IOSchedulingPriority=`` (``ioprio_set``, as ``ionice``),
``CPUWeight=`` (a cgroup's ``cpu.shares`` with cgroup v1, ``cpu.weight`` with v2), each
where this machine allows it. The trainer here is not traind's child, so those lines rank
the whole daemon below it; a trainer traind starts would get them too. The store servers
run on the same cores at normal priority, a harsher neighbour than a remote store, or with
``--servers lowest`` at the lowest (nice 19, their sessions' autogroups too), the nearest a
one-box bench comes to a store on another host. Each row also gives the cores the upload
alone kept busy, and from them the most of its rate an upload can keep beside a trainer
that keeps all of its own.

For each: the trainer's steps/s alone and while the upload runs (from the save returning to
the commit), the upload's MB/s alone and beside the trainer, and the time from save to safe.
The last lines give, for the defaults, ``trainer steps/s kept: P%`` and ``upload rate kept:
Q%`` (the worst store).

    python bench/interference.py --size 4GiB --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.time_to_safe import BLOCK, committed_at, running_store, save, start_daemon
from tests.support.sshd import descendants

from traind.util.units import format_size, parse_size

TRAINER = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(384, 384)
steps, mark = 0, time.time()
while True:
    for _ in range(8):
        a = torch.tanh(a @ a)
    steps += 1
    now = time.time()
    if now - mark >= 0.5:
        print(f"{now:.3f} {steps}", flush=True)
        steps, mark = 0, now
"""
"""A steady CPU-bound step; prints (time, steps since the last line) about twice a second."""

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Setting:
    """A way to run the daemon: its name, the unit's lines it stands for, how to apply it."""

    name: str
    unit: str
    nice: int = 0
    io_class: int | None = None  # IOPRIO_CLASS_BE = 2, IDLE = 3
    io_level: int = 4
    cpu_weight: int | None = None
    transfer_nice: int | None = None  # None: the config's default


DEFAULTS = Setting("defaults", "the shipped unit and config")
EVEN = Setting("nice 0", "[run] transfer_nice = 0", transfer_nice=0)
BUSY = Setting("busy host", "Nice=10 CPUWeight=20 IOSchedulingClass=best-effort "
               "IOSchedulingPriority=7", nice=10, io_class=2, io_level=7, cpu_weight=20)
SETTINGS = {s.name: s for s in (DEFAULTS, EVEN, BUSY)}


class Trainer:
    """The stand-in trainer's process and the steps it reported, with their times."""

    def __init__(self, threads: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(threads)],
                                     stdout=subprocess.PIPE, text=True)
        self.reports: queue.Queue[tuple[float, int]] = queue.Queue()
        self.seen: list[tuple[float, int]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            at, steps = line.split()
            self.reports.put((float(at), int(steps)))

    def rate(self, start: float, end: float) -> float:
        """Steps per second over the reports whose interval lies in [start, end]."""
        while True:
            try:
                self.seen.append(self.reports.get_nowait())
            except queue.Empty:
                break
        inside = [(at, n) for at, n in self.seen if start < at <= end]
        if len(inside) < 2:
            return float("nan")
        return sum(n for _, n in inside[1:]) / (inside[-1][0] - inside[0][0])

    def stop(self) -> None:
        """Kill it."""
        self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def cgroup(weight: int | None) -> Iterator[Path | None]:
    """A cpu cgroup of ``weight`` (systemd's CPUWeight= scale, 100 = a default peer) for the
    block, if this machine lets us make one; its cgroup.procs, or None."""
    if weight is None:
        yield None
        return
    v1 = CGROUP_V1.is_dir()
    group = (CGROUP_V1 if v1 else CGROUP_V2) / f"traind-bench-{os.getpid()}"
    try:
        group.mkdir()
        if v1:
            (group / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))
        else:
            (group / "cpu.weight").write_text(str(weight))
    except OSError as exc:
        print(f"  (no cgroup for CPUWeight={weight}: {exc}; nice and ionice only)")
        yield None
        return
    try:
        yield group / "cgroup.procs"
    finally:
        with contextlib.suppress(OSError):
            for pid in (group / "cgroup.procs").read_text().split():
                ((group.parent) / "cgroup.procs").write_text(pid)
            group.rmdir()


def limiter(setting: Setting, procs: Path | None) -> Callable[[int], None]:
    """What applies ``setting`` to a daemon's process group (its later children inherit)."""

    def apply(pgid: int) -> None:
        if setting.nice:
            os.setpriority(os.PRIO_PGRP, pgid, setting.nice)
        if setting.io_class is not None:
            subprocess.run(["ionice", "-c", str(setting.io_class), "-n", str(setting.io_level),
                            "-P", str(pgid)], check=True, timeout=10)
        if procs is not None:
            procs.write_text(str(pgid))

    return apply


@contextlib.contextmanager
def lowest(server: int | None) -> Iterator[None]:
    """For the block, keep the store's ``server`` and every process below it at the lowest
    priority: each thread at nice 19, each session's autogroup too (sshd starts a session per
    connection, so a thread lowers new ones every 50 ms). A store server on another host
    costs this one nothing; this is the nearest a one-box bench comes."""
    if server is None:  # the local store: nothing serves it
        yield
        return
    done = threading.Event()

    def lower() -> None:
        while not done.wait(0.05):
            for pid in [server, *descendants(server)]:
                with contextlib.suppress(OSError, ValueError):
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        os.setpriority(os.PRIO_PROCESS, int(task.name), 19)
                    if os.getsid(pid) == pid:
                        Path(f"/proc/{pid}/autogroup").write_text("19")

    thread = threading.Thread(target=lower, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


LOWEST = ("import os\nopen('/proc/self/autogroup', 'w').write('19')\n"
          "os.setpriority(os.PRIO_PROCESS, 0, 19)\n")
"""Prelude of a control's code: its thread and its session's autogroup at nice 19."""
SPIN = "import os\nos.fork()\nwhile True:\n    pass\n"
"""Pure CPU, two processes of it (as many cores as this box has), nothing else."""
COPY = """import os, shutil, sys
for _ in range(2):
    shutil.copyfile(sys.argv[1], sys.argv[1] + ".copy")
    fd = os.open(sys.argv[1] + ".copy", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.unlink(sys.argv[1] + ".copy")
"""
"""The page cache and disk path alone: copy a file twice and make it durable, no hashing."""


def floors(threads: int, size: int, work: Path) -> list[tuple[str, float, float]]:
    """The trainer alone, and beside a CPU spinner and a copy at the lowest priority (in
    sessions of their own): what priority takes back, and what it cannot (the kernel's
    writeback and the memory's bandwidth); each with the trainer's steps/s alone."""
    source = work / "floor.bin"
    work.mkdir(parents=True, exist_ok=True)
    block = os.urandom(BLOCK)
    with open(source, "wb") as f:
        for _ in range(size // BLOCK):
            f.write(block)
    os.sync()
    trainer = Trainer(threads)
    rows = []
    try:
        time.sleep(3)
        for label, code, args in (("2 CPU spinners at nice 19", SPIN, []),
                                  (f"copy {format_size(size)} twice + fsync at nice 19", COPY,
                                   [str(source)])):
            start = time.time()
            time.sleep(10)
            alone = trainer.rate(start, time.time())
            start = time.time()
            proc = subprocess.Popen([sys.executable, "-c", LOWEST + code, *args],
                                    start_new_session=True)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            end = time.time()
            time.sleep(1)
            rows.append((label, alone, trainer.rate(start, end)))
            print(f"  beside {label}: trainer {alone:6.1f} → {rows[-1][2]:6.1f} steps/s",
                  flush=True)
    finally:
        trainer.stop()
        source.unlink()
    return rows


def busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy (``/proc/stat``: user, nice,
    system, irq, softirq; not idle, iowait or a hypervisor's steal) since boot."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Row:
    """One store at one setting."""

    store: str
    setting: str
    trainer_alone: float
    trainer_beside: float
    upload_alone: float
    upload_beside: float
    safe_alone: float
    safe_beside: float
    upload_cores: float
    """Cores the upload alone kept busy (daemon, store server, everything), on average."""

    def bound(self, threads: int) -> float:
        """The share of its rate the upload can keep while the trainer keeps all its
        ``threads`` cores: the cores left over the cores it used alone (at most 1)."""
        return min(1.0, max(0.0, (os.cpu_count() or 1) - threads) / self.upload_cores)


def one(kind: str, setting: Setting, size: int, threads: int, work: Path,
        timeout: float, servers_lowest: bool) -> Row:
    """Trainer alone, upload alone, then both, for one store at one setting (its server at
    the lowest priority if ``servers_lowest``)."""
    with (running_store(kind, work) as store, cgroup(setting.cpu_weight) as procs,
          lowest(store.server) if servers_lowest else contextlib.nullcontext()):
        keys = "" if setting.transfer_nice is None else f"transfer_nice = {setting.transfer_nice}\n"
        daemon, out = start_daemon(work, store, run_keys=keys, limit=limiter(setting, procs))
        try:
            step = 0

            def upload() -> tuple[float, float]:
                nonlocal step
                step += 1
                ckpt, returned = save(out, step, size, marker=True)
                busy = busy_seconds()
                safe = committed_at(daemon, ckpt.name, timeout) - returned
                cores = (busy_seconds() - busy) / (time.time() - returned)
                shutil.rmtree(ckpt)
                store.empty()
                return safe, cores

            safe_alone, cores = upload()
            trainer = Trainer(threads)
            try:
                time.sleep(3)  # past torch's start-up
                quiet = time.time()
                time.sleep(10)
                alone = trainer.rate(quiet, time.time())
                step += 1
                ckpt, returned = save(out, step, size, marker=True)
                done = committed_at(daemon, ckpt.name, timeout)
                time.sleep(1)  # the report covering the commit
                beside = trainer.rate(returned, done)
            finally:
                trainer.stop()
            shutil.rmtree(ckpt)
            store.empty()
        finally:
            daemon.stop()
    safe_beside = done - returned
    row = Row(store.name, setting.name, alone, beside, size / 1e6 / safe_alone,
              size / 1e6 / safe_beside, safe_alone, safe_beside, cores)
    print(f"  {row.store:16s} {row.setting:10s} trainer {alone:6.1f} → {beside:6.1f} steps/s, "
          f"upload {row.upload_alone:5.0f} → {row.upload_beside:5.0f} MB/s "
          f"({cores:.2f} cores alone)", flush=True)
    return row


def print_table(rows: list[Row], size: int, threads: int, servers: str) -> None:
    """Side by side per store and setting; then the defaults' worst case in two lines."""
    print(f"\n{format_size(size)} checkpoint, trainer on {threads} thread(s), {os.cpu_count()} "
          f"CPUs, store servers at {servers} priority; upload MB/s and save → safe from the "
          "save returning to the commit\n")
    print("| store            | setting    | trainer steps/s alone → beside (kept) "
          "| upload MB/s alone → beside (kept) | save → safe s alone / beside "
          "| cores used alone | rate keepable |")
    print("|------------------|------------|---------------------------------------:"
          "|----------------------------------:|-----------------------------:"
          "|-----------------:|--------------:|")
    for r in rows:
        print(f"| {r.store:16s} | {r.setting:10s} "
              f"| {r.trainer_alone:8.1f} → {r.trainer_beside:8.1f} "
              f"({100 * r.trainer_beside / r.trainer_alone:5.1f}%) "
              f"| {r.upload_alone:8.0f} → {r.upload_beside:8.0f} "
              f"({100 * r.upload_beside / r.upload_alone:5.1f}%) "
              f"| {r.safe_alone:12.1f} / {r.safe_beside:12.1f} "
              f"| {r.upload_cores:16.2f} | {100 * r.bound(threads):12.0f}% |")
    print("\n(cores used alone: by everything on the machine while the upload ran without the "
          "trainer,\nthe store server included; rate keepable: the cores the trainer leaves "
          "over those, the most\nof its rate an upload can keep while the trainer keeps all "
          "of its own)")
    for setting in SETTINGS.values():
        mine = [r for r in rows if r.setting == setting.name]
        if mine:
            kept = min(100 * r.trainer_beside / r.trainer_alone for r in mine)
            rate = min(100 * r.upload_beside / r.upload_alone for r in mine)
            print(f"\n{setting.name} ({setting.unit}), worst store:")
            print(f"trainer steps/s kept: {kept:.0f}%")
            print(f"upload rate kept: {rate:.0f}%")


def main() -> None:
    """Parse the command line; run every store at every setting."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=4 * 1024**3,
                        help="checkpoint size (default 4GiB)")
    parser.add_argument("--threads", type=int, default=1, help="trainer threads (default 1)")
    parser.add_argument("--stores", default="local,s3,ssh", help="default local,s3,ssh")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per checkpoint")
    parser.add_argument("--workdir", default=None, help="where to put the data (default: tmp)")
    parser.add_argument("--servers", choices=("normal", "lowest"), default="normal",
                        help="the store servers' priority: normal (default), or lowest, "
                        "standing in for a store on another host")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"comma-separated, of {', '.join(SETTINGS)} (default all)")
    args = parser.parse_args()
    try:
        settings = [SETTINGS[name] for name in args.settings.split(",")]
    except KeyError as exc:
        parser.error(f"no setting {exc}; there are {', '.join(SETTINGS)}")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="traind-interference-") as tmp:
        floor = floors(args.threads, args.size, Path(tmp) / "floor")
        for kind in args.stores.split(","):
            for setting in settings:
                rows.append(one(kind, setting, args.size, args.threads,
                                Path(tmp) / kind / setting.name.replace(" ", "-"),
                                args.timeout, args.servers == "lowest"))
    print_table(rows, args.size, args.threads, args.servers)
    print("\nthe floor: what no priority takes back")
    for label, alone, beside in floor:
        print(f"trainer beside {label}: {alone:.1f} → {beside:.1f} steps/s "
              f"({100 * beside / alone:.0f}% kept)")


if __name__ == "__main__":
    main()

"""Benchmark: the CPU an idle daemon spends (local store, empty output_dir, no trainer).

The daemon runs with every timing at its default (a scan every ``poll_interval``).

Starts ``traind run`` with this checkout, and with ``--compare DIR`` (another checkout's
``daemon/`` directory, say the last commit before a change) a second daemon beside it, so
both are measured over the same minute on the same load. After a warm-up, each thread's
user+system CPU is read from ``/proc/<pid>/task/*/stat`` at the start and the end.

    python bench/idle_daemon.py --seconds 60 --compare /path/to/old/checkout/daemon
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid``, keyed ``tid name``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[f"{task.name} {name}"] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def start(label: str, pythonpath: Path, work: Path) -> subprocess.Popen[bytes]:
    """``traind run`` with the code in ``pythonpath``, on its own empty dirs."""
    base = work / label
    (base / "out").mkdir(parents=True)
    config = base / "traind.toml"
    config.write_text(  # every timing at its default, as a user's daemon has them
        f'[run]\nname = "idle"\noutput_dir = "{base / "out"}"\nstate_dir = "{base / "state"}"\n'
        f'[storage]\ntype = "local"\npath = "{base / "store"}"\n'
        f'[status]\nlisten = "127.0.0.1:{free_port()}"\n'
    )
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.Popen([sys.executable, "-m", "traind", "run", "-c", str(config)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured span")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before it")
    parser.add_argument("--compare", type=Path, help="another checkout's daemon/ directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traind-bench-idle-"))
    daemons = {"this checkout": start("this", ROOT / "daemon", work)}
    if args.compare:
        daemons[f"{args.compare}"] = start("compare", args.compare, work)
    try:
        time.sleep(args.warmup)
        before = {label: threads(p.pid) for label, p in daemons.items()}
        time.sleep(args.seconds)
        after = {label: threads(p.pid) for label, p in daemons.items()}
        print(f"\n### idle daemon CPU over {args.seconds:.0f} s (local store, nothing to do)\n")
        print("| daemon | CPU s | % of a core | busiest thread (CPU s) |")
        print("|---|---:|---:|---|")
        threads_of: dict[str, dict[str, float]] = {}
        for label, proc in daemons.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: traind exited with {proc.returncode}")
            spent = {t: after[label][t] - before[label].get(t, 0.0) for t in after[label]}
            total = sum(spent.values())
            busiest = max(spent, key=lambda t: spent[t])
            print(f"| {label} | {total:.2f} | {100 * total / args.seconds:.2f} | "
                  f"{busiest} ({spent[busiest]:.2f}) |")
            threads_of[label] = spent
        for label, spent in threads_of.items():
            busy = ", ".join(f"{t} {s:.2f}" for t, s in sorted(spent.items()) if s)
            print(f"\n{label}, CPU s by thread: {busy or 'none'}")
    finally:
        for proc in daemons.values():
            proc.terminate()
        for proc in daemons.values():
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

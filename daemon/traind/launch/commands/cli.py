"""``traind launch``: the command line of launching, following and tearing down runs.

``traind launch -c launch.toml`` brings a run up and follows it (Ctrl-C detaches; the run goes
on); ``traind launch list|status|logs|pull|down NAME`` manage it later, from any shell.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from traind.config import path_arg
from traind.errors import TraindError
from traind.launch import config as launch_config
from traind.launch.commands import flow, jobflow, manage
from traind.launch.handles import LaunchRecord, LaunchStore
from traind.launch.registry import JOB_BACKENDS, open_backend, open_job_backend
from traind.util.jsontext import strict_json

Context = flow.Context | jobflow.Context

log = structlog.get_logger("traind.launch")

EPILOG = """examples:
  traind launch -c launch.toml              # search, provision, install, start, follow
  traind launch -c launch.toml --detach     # ... and return once traind runs
  traind launch list
  traind launch status grpo-qwen
  traind launch logs grpo-qwen -f           # Ctrl-C stops following, not the run
  traind launch pull grpo-qwen              # newest committed checkpoint → ./checkpoints/
  traind launch down grpo-qwen              # pull newest, stop traind, destroy the host
  traind launch down grpo-qwen --no-pull    # destroy without pulling"""


def add_launch_parser(subparsers: Any) -> None:
    """Add ``launch`` (with its actions) to the ``traind`` subcommand parsers."""
    summary = "Rent or reach a GPU host, run traind there, bring checkpoints back, tear down."
    launch = subparsers.add_parser(
        "launch", help=summary, description=summary, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_help = "launch.toml (default ./launch.toml; for actions, the one saved at launch)"
    launch.add_argument("-c", "--config", metavar="PATH", type=path_arg, help=config_help,
                        default=argparse.SUPPRESS)  # keeps a -c given before `launch`
    launch.add_argument("--name", help="launch name (default: name in launch.toml)")
    launch.add_argument("--detach", action="store_true", help="return once traind runs")
    actions = launch.add_subparsers(dest="launch_action", metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", metavar="PATH", type=path_arg, help=config_help,
                        default=argparse.SUPPRESS)  # keeps a -c given before the action
    actions.add_parser("list", help="list saved launches")
    status = actions.add_parser("status", parents=[common], help="host state, traind, last commit")
    status.add_argument("name", metavar="NAME")
    status.add_argument("--json", action="store_true", help="print JSON")
    logs = actions.add_parser("logs", parents=[common], help="print traind's log on the host")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("-n", "--lines", type=int, default=100, help="lines of history (100)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following (Ctrl-C stops)")
    pull = actions.add_parser("pull", parents=[common], help="copy a committed checkpoint here")
    pull.add_argument("name", metavar="NAME")
    pull.add_argument("tag", metavar="TAG", nargs="?", default="latest", help="(default latest)")
    pull.add_argument("--dir", type=Path, help="parent directory (default [pull] dir/NAME)")
    down = actions.add_parser("down", parents=[common], help="pull newest, stop, destroy")
    down.add_argument("name", metavar="NAME")
    down.add_argument("--no-pull", action="store_true", help="do not pull the newest checkpoint")


async def handle(args: argparse.Namespace) -> int:
    """Run the ``launch`` command ``args`` describes; return the exit status."""
    action = getattr(args, "launch_action", None)
    if action is None:
        return await _up(args)
    store = LaunchStore()
    if action == "list":
        return _list(store)
    record = store.load(args.name)
    ctx = _context(args.config or record.config_path, store)
    ops: Any = jobflow if isinstance(ctx, jobflow.Context) else manage  # the same calls
    if action == "status":
        facts = await ops.status(ctx, record)
        print(strict_json(facts, indent=2) if args.json else _table(facts))
    elif action == "logs":
        detach = _detach_on_sigint()
        await ops.logs(ctx, record, args.lines, args.follow, detach, _print)
    elif action == "pull":
        print(await ops.pull(ctx, record, args.tag, args.dir))
    elif action == "down":
        pulled = await ops.down(ctx, record, pull_first=not args.no_pull)
        print(f"{record.name}: down" + (f"; newest checkpoint in {pulled}" if pulled else ""))
    return 0


def _context(path: str | Path, store: LaunchStore) -> Context:
    cfg = launch_config.load(Path(path))
    if cfg.backend in JOB_BACKENDS:
        return jobflow.Context(cfg, open_job_backend(cfg), store)
    return flow.Context(cfg, open_backend(cfg, store), store)


async def _up(args: argparse.Namespace) -> int:
    path = Path(args.config or "launch.toml")
    store = LaunchStore()
    ctx = _context(path, store)
    name = args.name or ctx.config.name
    task = asyncio.current_task()
    assert task is not None
    detach = asyncio.Event()
    phase = "setup"

    def on_sigint() -> None:
        nonlocal phase
        if phase == "follow":
            detach.set()
        elif phase == "setup":
            phase = "aborting"
            log.warning("launch_aborting", launch=name)
            task.cancel()
        else:
            log.warning("launch_busy_please_wait", launch=name, phase=phase)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    ops: Any = jobflow if isinstance(ctx, jobflow.Context) else flow
    try:
        try:
            record = await ops.launch(ctx, path, name)
        except asyncio.CancelledError:
            _say_what_is_left(store, name)
            return 130
        except TraindError:
            _say_what_is_left(store, name)
            raise
        if args.detach:
            print(f"{name}: traind runs on {record.handle.instance_id}; "
                  f"traind launch logs {name} -f | status {name} | down {name}")
            return 0
        phase = "follow"
        outcome = await ops.follow_recovering(ctx, record, detach, _print)
        print(f"{name}: {outcome}", file=sys.stderr)
        if outcome == "finished" and ctx.config.host.on_finish == "down":
            phase = "down"
            await (jobflow if ops is jobflow else manage).down(ctx, store.load(name))
        return 0 if outcome in ("finished", "detached", "taken down") else 1
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _say_what_is_left(store: LaunchStore, name: str) -> None:
    if store.exists(name):
        record = store.load(name)
        print(f"traind: launch {name} failed; its host {record.handle.backend}:"
              f"{record.handle.instance_id} may still be running (and billing). Remove it with:\n"
              f"  traind launch down {name} --no-pull", file=sys.stderr)


def _detach_on_sigint() -> asyncio.Event:
    detach = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, detach.set)
    return detach


def _list(store: LaunchStore) -> int:
    records: list[LaunchRecord] = [store.load(n) for n in store.names()]
    if records:
        print(f"{'NAME':24} {'BACKEND':7} {'INSTANCE':20} REMOTE_ROOT")
    for r in records:
        print(f"{r.name:24} {r.handle.backend:7} {r.handle.instance_id:20} {r.remote_root}")
    if not records:
        print(f"(no launches saved in {store.root})")
    return 0


def _table(facts: dict[str, Any]) -> str:
    return "\n".join(f"{k:15} {_fact(k, v)}" for k, v in facts.items())


def _fact(key: str, value: Any) -> str:
    """One value of ``launch status`` for people: a commit as tag, size and time."""
    if value is None or value == "":
        return "-"
    if key == "last_commit" and isinstance(value, dict):
        from traind.util.units import format_size

        size = format_size(value["bytes"]) if isinstance(value.get("bytes"), int) else "?"
        return f"{value.get('tag', '?')} ({size}) at {value.get('timestamp', '?')}"
    if key == "recoveries" and isinstance(value, list):
        return "".join(f"\n  {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r['at']))}Z "
                       f"{r['state']} ({r['message'] or '-'}): from {r['checkpoint'] or 'scratch'}"
                       f", {r['steps_lost'] if r['steps_lost'] is not None else '?'} steps lost, "
                       f"training again {r['seconds']}s later" for r in value) or "-"
    return str(value)


def _print(line: str) -> None:
    print(line, flush=True)

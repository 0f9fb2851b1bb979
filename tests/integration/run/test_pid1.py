"""``traind run`` as PID 1 of a PID namespace of its own (``unshare --pid --fork
--mount-proc``), as a container's entrypoint is, supervising a real tiny TRL trainer whose
double-forked grandchildren are orphaned: no zombie is left, the trainer's exit status is
traind's, and SIGTERM or SIGINT commits the newest checkpoint within a 10 s grace."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from tests.support.checkpoints import setup, stored
from tests.support.daemon import DaemonProcess
from tests.support.requires import missing, need_binary, need_module
from tests.support.tiny_train import CRASH_EXIT, ORPHAN_SECONDS, QUIET_ENV, train_command

from traind.supervisor.procfs import Proc, descendants, process_table

GRACE = 10.0
"""The platform's grace between its stop signal and SIGKILL (docker stop's default)."""


@pytest.fixture(autouse=True)
def _needs() -> None:
    need_module("trl")
    if os.geteuid() != 0:
        missing("a PID namespace needs root (unshare --pid)")


def init_of(daemon: DaemonProcess) -> int:
    """The host pid of the namespace's PID 1: the child of ``daemon``'s unshare."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = [p for p in process_table().values() if p.ppid == daemon.proc.pid]
        if children:
            return children[0].pid
        time.sleep(0.02)
    raise AssertionError("unshare started no child")


def namespace(init: int) -> list[Proc]:
    """Every process of the namespace whose PID 1 is ``init`` (host pid), zombies included."""
    table = process_table()
    return [table[pid] for pid in {init, *descendants(table, init)} if pid in table]


def start(tmp_path: Path, **opts: object) -> tuple[DaemonProcess, int, Path, Path]:
    """traind as PID 1 of a new PID namespace (and that PID 1's host pid), its trainer the
    tiny TRL run with ``opts``; the run's output dir and local store."""
    out = tmp_path / "out"
    argv = train_command(out, save_steps=1, callback=True, leave_orphans=True, **opts)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    trainer = f"""
[trainer]
command = {json.dumps(argv)}
env = {{ {env} }}
stop_grace = "5s"
exit_when_failed = true
restart = {{ policy = "never" }}
"""
    out, store, cfg = setup(tmp_path, extra=trainer)
    unshare = [need_binary("unshare"), "--pid", "--fork", "--mount-proc", "--"]
    daemon = DaemonProcess(cfg, wrapper=unshare)
    try:
        return daemon, init_of(daemon), out, store
    except BaseException:
        daemon.kill()
        raise


def orphans(daemon: DaemonProcess) -> list[int]:
    """The namespace pids of the trainer's orphaned grandchildren, as it printed them."""
    said = daemon.wait_for(lambda e: str(e.get("line", "")).startswith("orphans="), timeout=120)
    return [int(pid) for pid in said["line"].split("=", 1)[1].split(",")]


def newest_saved(out: Path, after: int) -> int:
    """Wait for a complete ``checkpoint-N`` with N > ``after`` in ``out``; return N."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        steps = [int(d.name.rsplit("-", 1)[1]) for d in out.glob("checkpoint-*")
                 if (d / "trainer_state.json").exists()]
        if steps and max(steps) > after:
            return max(steps)
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint after {after} in {out}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_pid1_reaps_orphans_and_commits_the_newest_on_stop(tmp_path: Path, sig: int) -> None:
    """As PID 1, traind reaps the trainer's orphan that died (no zombie in the namespace),
    and on ``sig`` it stops the trainer and the orphan that outlived its parent and commits
    the newest checkpoint, exiting 0 within the grace a platform gives."""
    daemon, init, out, store = start(tmp_path, max_steps=500, step_sleep=0.3)
    try:
        short, long = orphans(daemon)
        first = daemon.wait_for("checkpoint_committed", timeout=120)
        time.sleep(ORPHAN_SECONDS + 3)  # the short orphan died and was adopted long since
        procs = namespace(init)
        assert [p for p in procs if p.state == "Z"] == [], procs
        assert len(procs) >= 3  # traind, the trainer and the long-lived orphan
        newest = newest_saved(out, after=int(first["tag"].rsplit("-", 1)[1]))
        sent = time.monotonic()
        os.kill(init, sig)
        rc = daemon.proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        daemon.kill()
    assert rc == 0, "".join(daemon.raw[-30:])
    assert took < GRACE, took
    assert f"checkpoint-{newest}" in stored(store, "exp")
    assert daemon.events[-1]["event"] == "daemon_stopped"
    assert daemon.events[-1]["unstored"] == []
    assert short != long


def test_pid1_passes_the_trainers_exit_status_on(tmp_path: Path) -> None:
    """A trainer that crashes (exit 17) and is not restarted ends traind with status 17,
    once the checkpoint it saved before the crash is committed."""
    daemon, _, _, store = start(tmp_path, max_steps=10, crash_at_step=2)
    try:
        orphans(daemon)
        rc = daemon.proc.wait(timeout=180)
    finally:
        daemon.kill()
    assert rc == CRASH_EXIT, "".join(daemon.raw[-30:])
    assert "checkpoint-2" in stored(store, "exp")
    assert daemon.events[-1]["event"] == "daemon_stopped"

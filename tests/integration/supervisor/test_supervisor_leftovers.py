"""Leftovers: what a SIGKILLed daemon left running is stopped by the next daemon of the same
state_dir before it starts a child, and nothing of another state_dir is touched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.checkpoints import setup
from tests.support.daemon import DaemonProcess, Event
from tests.support.fake_vllm import alive, pids_in

from traind.config import ChildConfig
from traind.supervisor.env import CHILD_TAG, OWNER_TAG, new_tag, owner_of
from traind.supervisor.leftovers import stop_leftovers
from traind.supervisor.policy import Role
from traind.supervisor.process import ManagedProcess

# The grandchild leaves the trainer's process group and ignores SIGTERM; the trainer records
# "<its pid> <grandchild pid>" once the grandchild is ready, then trains forever.
TRAINER = """
import os, subprocess, sys, time
deaf = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)")
grandchild = subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE,
                              start_new_session=True)
grandchild.stdout.readline()
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()} {grandchild.pid}\\n")
print("training", flush=True)
time.sleep(600)
"""
SLEEPER = "import time; time.sleep(600)"


@contextlib.contextmanager
def killing(pidfile: Path) -> Iterator[None]:
    """On the way out, SIGKILL every pid recorded in ``pidfile`` by then."""
    try:
        yield
    finally:
        for pid in pids_in(pidfile):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def trainer_started(e: Event) -> bool:
    return e.get("event") == "child_started" and e.get("child") == "trainer"


def recorded(pidfile: Path, count: int, within: float = 10.0) -> list[int]:
    """The first ``count`` (trainer, grandchild) pid pairs in ``pidfile``, flattened."""
    deadline = time.monotonic() + within
    while len(pids := pids_in(pidfile)) < 2 * count:
        assert time.monotonic() < deadline, f"{pidfile}: {pids}"
        time.sleep(0.02)
    return pids[: 2 * count]


def marked(state_dir: Path, child: str) -> subprocess.Popen[bytes]:
    """A sleeper whose environment says it is child ``child`` of a daemon of ``state_dir``."""
    env = {**os.environ, OWNER_TAG: owner_of(state_dir), CHILD_TAG: new_tag(child)}
    return subprocess.Popen([sys.executable, "-c", SLEEPER], env=env)


def test_restarted_daemon_stops_what_the_killed_one_left(tmp_path: Path) -> None:
    """After SIGKILL of `traind run` its trainer and the trainer's escaped grandchild run on; the
    next daemon of that state_dir stops both (SIGTERM, SIGKILL after the grace) before its own
    trainer starts."""
    pidfile = tmp_path / "trainers"
    command = [sys.executable, "-c", TRAINER, str(pidfile)]
    extra = f'[trainer]\ncommand = {json.dumps(command)}\nstop_grace = "1s"\n'
    _, _, cfg = setup(tmp_path, extra=extra)
    with killing(pidfile):
        first = DaemonProcess(cfg)
        try:
            first.wait_for(trainer_started)
            old_trainer, old_grandchild = recorded(pidfile, 1)
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(timeout=10)
        finally:
            first.kill()
        assert alive(old_trainer)
        assert alive(old_grandchild)

        second = DaemonProcess(cfg)
        try:
            second.wait_for(trainer_started)
            recorded(pidfile, 2)
            assert not alive(old_trainer)
            assert not alive(old_grandchild)
            assert second.stop() == 0
        finally:
            second.kill()
    stopped = {e["pid"]: (e["child"], e["signal"]) for e in second.named("orphan_stopped")}
    assert stopped == {old_trainer: ("trainer", "SIGTERM"), old_grandchild: ("trainer", "SIGKILL")}
    order = [e["event"] for e in second.events if e["event"] == "orphan_stopped" or
             trainer_started(e)]
    assert order == ["orphan_stopped", "orphan_stopped", "child_started"]


async def test_only_leftovers_of_this_state_dir_are_stopped(tmp_path: Path) -> None:
    """A process marked with another state_dir (here one sharing a prefix) is left alone; one
    marked with ours is stopped even when ours is named through a symlink; nothing is logged
    when nothing is left."""
    ours, other, link = tmp_path / "state", tmp_path / "state2", tmp_path / "link"
    ours.mkdir()
    other.mkdir()
    link.symlink_to(ours)
    leftover, bystander = marked(ours, "env-server"), marked(other, "env-server")
    try:
        with capture_logs() as logs:
            async with asyncio.timeout(15):
                await stop_leftovers(link, [])
                assert leftover.poll() == -signal.SIGTERM  # gone, reaped here
                await stop_leftovers(link, [])
        assert bystander.poll() is None
    finally:
        for p in (leftover, bystander):
            p.kill()
            p.wait(timeout=10)
    assert logs == [{"event": "orphan_stopped", "log_level": "warning", "pid": leftover.pid,
                     "child": "env-server", "signal": "SIGTERM"}]


@pytest.mark.parametrize("configured", [{}, {OWNER_TAG: "/elsewhere"}])
async def test_child_is_marked_with_its_daemons_state_dir(
    tmp_path: Path, configured: dict[str, str]
) -> None:
    """Every child carries its daemon's state_dir; neither the inherited environment nor the
    child's configured ``env`` can change it."""
    lines: list[str] = []
    code = f"import os; print(os.environ[{OWNER_TAG!r}])"
    config = ChildConfig(command=(sys.executable, "-c", code), env=configured)
    p = ManagedProcess("marked", config, Role.SERVICE, log_dir=tmp_path, owner="/ours",
                       base_env={**os.environ, OWNER_TAG: "/inherited"},
                       on_line=lambda stream, line: lines.append(line))
    async with asyncio.timeout(10):
        await p.start()
        assert await p.wait() == 0
        await p.stop()
    assert lines == ["/ours"]

"""``traind run`` as supervisor, through the real CLI: a crash-looping trainer ends FATAL
while checkpoints keep streaming, and SIGTERM leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.support.checkpoints import setup, stored, write_checkpoint
from tests.support.daemon import DaemonProcess
from tests.support.fake_vllm import command as vllm_command
from tests.support.net import free_port


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_crash_loop_goes_fatal_and_streaming_continues(tmp_path: Path) -> None:
    """A trainer that always fails is given up on (FATAL) after its restarts; a checkpoint
    written afterwards is still committed and the daemon keeps running."""
    crash = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
    trainer = (
        f"[trainer]\ncommand = {json.dumps(crash)}\n"
        'restart = { backoff_initial = "0.1s", backoff_max = "0.2s", max_restarts = 2 }\n'
    )
    out, store, cfg = setup(tmp_path, extra=trainer)
    daemon = DaemonProcess(cfg)
    try:
        fatal = daemon.wait_for("child_fatal", timeout=60)
        assert fatal["child"] == "trainer"
        assert len(daemon.named("child_started")) == 3  # the first start and 2 restarts
        daemon.wait_for("supervision_ended", timeout=10)
        write_checkpoint(out, 7)
        daemon.wait_for("checkpoint_committed", timeout=30)
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert sorted(stored(store, "exp")) == ["checkpoint-7"]


def test_sigterm_stops_every_child_within_grace(tmp_path: Path) -> None:
    """SIGTERM to the daemon stops the trainer, a vLLM that ignores SIGTERM (killed after
    its grace) and its escaped grandchild, then the daemon exits 0 — nothing left behind."""
    port = free_port()
    grandchild = tmp_path / "grandchild.pid"
    vllm = vllm_command(port, "--fake-ignore-sigterm", "--fake-grandchild", str(grandchild))
    sleeper = [sys.executable, "-c", "import time; print('training', flush=True); time.sleep(600)"]
    extra = f"""
[vllm]
command = {json.dumps(list(vllm))}
health = {{ url = "http://127.0.0.1:{port}/health", interval = "0.2s", successes = 1 }}
stop_grace = "1s"

[trainer]
command = {json.dumps(sleeper)}
stop_grace = "2s"
"""
    _, _, cfg = setup(tmp_path, extra=extra)
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for(
            lambda e: e.get("event") == "child_started" and e.get("child") == "trainer",
            timeout=60,
        )
        pids = [e["pid"] for e in daemon.named("child_started")]
        deadline = time.monotonic() + 10
        while not grandchild.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pids.append(int(grandchild.read_text()))
        assert all(alive(p) for p in pids)
        started = time.monotonic()
        assert daemon.stop(signal.SIGTERM, timeout=30) == 0
        assert time.monotonic() - started < 1 + 2 + 5  # both graces, plus slack
    finally:
        daemon.kill()
    assert [p for p in pids if alive(p)] == []
    names = [e.get("event") for e in daemon.events]
    trainer_stop = next(
        i
        for i, e in enumerate(daemon.events)
        if e.get("event") == "child_stopping" and e.get("child") == "trainer"
    )
    vllm_stop = next(
        i
        for i, e in enumerate(daemon.events)
        if e.get("event") == "child_stopping" and e.get("child") == "vllm"
    )
    assert trainer_stop < vllm_stop  # the trainer goes first
    assert "child_killed" in names  # vLLM ignored SIGTERM and was killed after its grace


def test_last_checkpoint_of_a_finished_trainer_is_committed_without_waiting(
    tmp_path: Path,
) -> None:
    """A trainer that exits 0 right after its last save has it committed before
    ``run_complete``, and the daemon exits without waiting out settle + 2 * poll_interval."""
    out = tmp_path / "out"
    save = (
        "import os, sys\n"
        "for step in (1, 2):\n"
        f"    d = os.path.join({str(out)!r}, f'checkpoint-{{step}}'); os.makedirs(d)\n"
        "    open(os.path.join(d, 'w.bin'), 'wb').write(os.urandom(1000))\n"
        "    open(os.path.join(d, 'trainer_state.json'), 'w').write('{}')\n"
    )
    trainer = f"[trainer]\ncommand = {json.dumps([sys.executable, '-c', save])}\n"
    _, store, cfg = setup(tmp_path, extra=trainer)
    cfg.write_text(cfg.read_text().replace('poll_interval = "200ms"', 'poll_interval = "60s"'))
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("child_exited", timeout=30)
        exited = time.monotonic()
        assert daemon.proc.wait(timeout=60) == 0, "".join(daemon.raw[-30:])
        took = time.monotonic() - exited
    finally:
        daemon.kill()
    assert took < 30, took  # settle + 2 * poll_interval would be 121 s
    assert sorted(stored(store, "exp")) == ["checkpoint-1", "checkpoint-2"]
    names = [e.get("event") for e in daemon.events]
    committed = [i for i, e in enumerate(daemon.events)
                 if e.get("event") == "checkpoint_committed"]
    assert len(committed) == 2
    assert max(committed) < names.index("run_complete")

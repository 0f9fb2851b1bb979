"""The real daemon hashes and copies checkpoints in threads below its own priority, while its
event loop's thread and the trainer it starts keep the daemon's."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from tests.support.checkpoints import setup, write_checkpoint
from tests.support.daemon import TESTS_NICE, DaemonProcess
from tests.support.procfs import autogroup_nice, autogroups, nice_of, threads_of

from traind.util.proc import priority


@pytest.mark.skipif(not priority.per_thread(), reason="per-thread nice is Linux's")
def test_transfers_run_below_the_trainer(tmp_path: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the daemon starts at this
    seen = tmp_path / "trainer-nice"
    code = "\n".join([  # the trainer writes its nice value, then its autogroup's, and waits
        "import os, time",
        "group = '/proc/self/autogroup'",
        "own = open(group).read().split()[-1] if os.path.exists(group) else 'none'",
        f"open({str(seen)!r}, 'w').write(f'{{os.getpriority(os.PRIO_PROCESS, 0)}} {{own}}')",
        "time.sleep(600)",
    ])
    out, _, cfg = setup(
        tmp_path, extra=f"[trainer]\ncommand = {json.dumps([sys.executable, '-c', code])}\n")
    cfg.write_text(cfg.read_text().replace(TESTS_NICE, ""))  # the default, as shipped
    daemon = DaemonProcess(cfg)
    try:
        started = daemon.wait_for("daemon_starting", timeout=60)
        assert started["transfer_nice"] == min(19, base + 10)  # the default, 10 below
        daemon.wait_for("child_started", timeout=60)
        write_checkpoint(out, 1)
        daemon.wait_for("checkpoint_committed", timeout=60)
        nices = {tid: nice_of(daemon.proc.pid, tid) for tid in threads_of(daemon.proc.pid)}
        group = autogroup_nice(daemon.proc.pid)
        deadline = time.monotonic() + 30
        while not seen.exists() or not seen.read_text():
            assert time.monotonic() < deadline, "the trainer never wrote its nice value"
            time.sleep(0.1)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert nices.pop(daemon.proc.pid) == base  # the event loop's thread
    assert min(19, base + 10) in nices.values()  # the threads that hashed and copied
    trainer = seen.read_text().split()
    assert int(trainer[0]) == base  # the trainer, started from the loop's thread
    if autogroups():  # the daemon leads its session, so its own autogroup is lowered
        assert group == min(19, base + 10)
        assert trainer[1] == "0"  # and the trainer's session is a group of its own, at 0

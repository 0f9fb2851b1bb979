"""Failures are visible to monitoring, through the real CLI: a child's exit code in
``traind status`` and ``/metrics``, failed and retried uploads counted, bytes counted as
they reach the store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tests.support.checkpoints import setup, write_checkpoint
from tests.support.daemon import DaemonProcess
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import running_seaweed

MIB = 1024 * 1024
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def listen(cfg: Path) -> str:
    """The status address the test config chose."""
    found = re.search(r'listen = "([^"]+)"', cfg.read_text())
    assert found is not None
    return found[1]


def scrape(cfg: Path) -> Samples:
    """Every sample of the daemon's ``/metrics``: (name, sorted labels) → value."""
    with urllib.request.urlopen(f"http://{listen(cfg)}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait until ``check()`` holds, polling; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_trainer_exit_code_shows_in_status_and_metrics(tmp_path: Path) -> None:
    """A trainer that exits 17 and is restarted leaves LAST EXIT 17 and an error naming
    the code in ``traind status``, and ``traind_child_exits_total{code="17"}`` in /metrics."""
    first = tmp_path / "crashed-once"
    code = (f"import pathlib, sys, time; p = pathlib.Path({str(first)!r})\n"
            "if not p.exists(): p.touch(); sys.exit(17)\n"
            "time.sleep(600)")
    trainer = (
        f"[trainer]\ncommand = {json.dumps([sys.executable, '-c', code])}\n"
        'restart = { backoff_initial = "0.1s", backoff_max = "0.2s" }\n'
    )
    _, _, cfg = setup(tmp_path, extra=trainer)
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for(lambda e: e.get("event") == "child_exited" and e["returncode"] == 17,
                        timeout=60)
        until(lambda: len(daemon.named("child_started")) == 2, "the restart", timeout=30)
        until(lambda: daemon.named("child_state")[-1]["state"] == "RUNNING", "RUNNING")
        shown = subprocess.run(
            [sys.executable, "-m", "traind", "status", "-c", str(cfg)],
            capture_output=True, text=True, timeout=60,
        )
        raw = subprocess.run(
            [sys.executable, "-m", "traind", "status", "--json", "-c", str(cfg)],
            capture_output=True, text=True, timeout=60,
        )
        metrics = scrape(cfg)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith("trainer"))
    assert row.split()[1] == "RUNNING"
    assert row.split()[-1] == "17"  # LAST EXIT, kept while the restart runs
    errors = json.loads(raw.stdout)["errors"]
    assert any(e["event"] == "child_backoff" and "returncode=17" in e["message"]
               for e in errors)
    assert "child_backoff" in shown.stdout.split("recent errors")[1]
    exits = ("traind_child_exits_total", (("child", "trainer"), ("code", "17")))
    assert metrics[exits] == 1


def test_upload_bytes_failures_and_retries_are_counted(tmp_path: Path) -> None:
    """``traind_uploaded_bytes_total`` moves while a throttled upload is under way (before
    its commit); with the store down, failed uploads and S3 retries are counted, and the
    checkpoint is committed once the store is back."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        storage = server.storage_toml(
            part_size="5MiB", concurrency=1, max_bandwidth="5MB", retries=1,
            retry_max_delay="0.2s", connect_timeout="1s",
        )
        out, _, cfg = setup(tmp_path, storage=storage)
        daemon = DaemonProcess(cfg)
        try:
            daemon.wait_for("daemon_ready", timeout=30)
            assert scrape(cfg)[("traind_upload_failures_total", ())] == 0
            write_checkpoint(out, 1, size=30 * MIB, nfiles=1)
            sent = ("traind_uploaded_bytes_total", ())
            until(lambda: scrape(cfg)[sent] >= 5 * MIB, "bytes counted mid-upload")
            assert not daemon.named("checkpoint_committed")  # counted before the commit
            daemon.wait_for("checkpoint_committed", timeout=60)
            assert scrape(cfg)[sent] >= 30 * MIB

            server.stop()
            write_checkpoint(out, 2)
            daemon.wait_for("checkpoint_upload_failed", timeout=60)
            metrics = scrape(cfg)
            assert metrics[("traind_upload_failures_total", ())] >= 1
            assert metrics[("traind_storage_retries_total", (("backend", "s3"),))] >= 1
            server.start()
            daemon.wait_for(lambda e: e.get("event") == "checkpoint_committed"
                            and e["tag"] == "checkpoint-2", timeout=90)
            assert daemon.stop() == 0
        finally:
            daemon.kill()

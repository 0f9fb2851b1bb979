"""The running daemon as systemd and an operator see it: sd_notify datagrams, /status and
/metrics against what really happened, and ``traind status``."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tests.support.checkpoints import setup, write_checkpoint
from tests.support.daemon import DaemonProcess, is_event


def listen_of(cfg: Path) -> str:
    match = re.search(r'listen = "([^"]+)"', cfg.read_text())
    assert match
    return match[1]


def receive_all(sock: socket.socket, seconds: float) -> list[str]:
    """Every datagram that arrives within ``seconds``."""
    got = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    return got


def receive_until(sock: socket.socket, prefix: str, seconds: float) -> list[str]:
    """Datagrams up to and including the first starting with ``prefix`` (within
    ``seconds``, however slowly a loaded machine starts the daemon)."""
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while not any(m.startswith(prefix) for m in got):
        left = deadline - time.monotonic()
        assert left > 0, f"no {prefix} datagram within {seconds} s: {got}"
        got += receive_all(sock, min(left, 0.5))
    return got


def test_sd_notify_lifecycle(tmp_path: Path) -> None:
    """READY at once, STATUS on changes, WATCHDOG at half the period, RELOADING→READY
    around SIGHUP, STOPPING on SIGTERM."""
    out, _, cfg = setup(tmp_path)
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"}
    daemon = DaemonProcess(cfg, env=env)
    try:
        first = receive_until(sock, "READY=1", 60)
        assert first[0].startswith("READY=1"), first
        first += receive_all(sock, 0.5)
        assert any(m.startswith("STATUS=") for m in first)
        pings = [m for m in receive_all(sock, 2.0) if m == "WATCHDOG=1"]
        assert 5 <= len(pings) <= 14, len(pings)  # every 0.2 s
        write_checkpoint(out, 1)
        daemon.wait_for("checkpoint_committed", timeout=30)
        statuses = [m for m in receive_all(sock, 0.5) if m.startswith("STATUS=")]
        assert any("checkpoint-1" in m for m in statuses), statuses
        daemon.proc.send_signal(signal.SIGHUP)
        around = [m for m in receive_all(sock, 1.5) if m != "WATCHDOG=1"]
        reloading = next(i for i, m in enumerate(around) if m.startswith("RELOADING=1"))
        assert re.search(r"MONOTONIC_USEC=\d+", around[reloading])
        assert any(m.startswith("READY=1") for m in around[reloading + 1 :])
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=20) == 0
        assert "STOPPING=1" in receive_all(sock, 0.5)
    finally:
        daemon.kill()
        sock.close()


def test_status_and_metrics_match_a_real_run(tmp_path: Path) -> None:
    """/status, /metrics and `traind status` report exactly the checkpoints committed."""
    out, _, cfg = setup(tmp_path)
    base = f"http://{listen_of(cfg)}"
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("daemon_ready", timeout=20)
        sizes = {}
        for step in (1, 2, 3):
            write_checkpoint(out, step, size=100_000 * step)
            sizes[step] = sum(p.stat().st_size for p in (out / f"checkpoint-{step}").iterdir())
            daemon.wait_for(is_event("checkpoint_committed", step=step), timeout=30)
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
            assert r.read() == b"ok"
        with urllib.request.urlopen(f"{base}/status", timeout=5) as r:
            status = json.load(r)
        assert status["state"] == "running"
        assert status["pid"] == daemon.proc.pid
        assert [(c["tag"], c["bytes"]) for c in status["committed"]] == [
            (f"checkpoint-{s}", sizes[s]) for s in (1, 2, 3)
        ]
        assert status["watcher"]["queued"] == 0
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            text = r.read().decode()
        samples = {
            s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
        }
        assert samples["traind_checkpoints_committed_total"] == 3
        assert samples["traind_uploaded_bytes_total"] == sum(sizes.values())
        assert samples["traind_last_committed_step"] == 3
        assert samples["traind_commit_seconds_count"] == 3
        table = subprocess.run(
            [sys.executable, "-m", "traind", "status", "-c", str(cfg)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert table.returncode == 0, table.stderr
        assert "checkpoint-3" in table.stdout
        as_json = subprocess.run(
            [sys.executable, "-m", "traind", "status", "-c", str(cfg), "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(as_json.stdout)["run"] == "exp"
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    gone = subprocess.run(
        [sys.executable, "-m", "traind", "status", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert gone.returncode == 3
    assert "is the service running?" in gone.stderr

"""``traind run`` with the S3 backend killed by SIGKILL in the middle of a multipart upload
and started again: finished parts are not sent again, nothing partial is ever listed, the
checkpoint is committed once and restores byte for byte."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.support.checkpoints import setup, write_checkpoint
from tests.support.daemon import DaemonProcess
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import running_seaweed

MIB = 1024 * 1024


def parts_recorded(journal: Path) -> int:
    """Finished parts the daemon has recorded for its multipart uploads so far."""
    if not journal.exists():
        return 0
    with sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=1) as db:
        rows = db.execute("SELECT state FROM resume").fetchall()
    return sum(len(json.loads(state)["parts"]) for (state,) in rows)


def traind(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traind", *args, "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sigkill_mid_multipart_resumes_without_resending(tmp_path: Path) -> None:
    """Parts recorded before SIGKILL are not uploaded again after the restart."""
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        storage = server.storage_toml(part_size="5MiB", concurrency=1, max_bandwidth="20MB")
        out, _, cfg = setup(tmp_path, storage=storage)
        journal = tmp_path / "state/journal.sqlite3"

        first = DaemonProcess(cfg)
        try:
            first.wait_for("daemon_ready", timeout=30)
            expected = write_checkpoint(out, 1, size=60 * MIB, nfiles=1)
            deadline = time.monotonic() + 60
            while (done := parts_recorded(journal)) < 3:
                assert time.monotonic() < deadline, "".join(first.raw[-20:])
                time.sleep(0.05)
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(timeout=10)
        finally:
            first.kill()
        assert first.named("checkpoint_committed") == []
        assert json.loads(traind(cfg, "list", "--json").stdout) == []  # nothing partial shows

        second = DaemonProcess(cfg)
        try:
            resumed = second.wait_for("s3_upload_resumed", timeout=60)
            committed = second.wait_for("checkpoint_committed", timeout=120)
            assert second.stop() == 0
        finally:
            second.kill()
        assert resumed["parts_done"] >= done
        assert committed["sent_bytes"] <= committed["bytes"] - done * 5 * MIB
        assert len(second.named("checkpoint_committed")) == 1
        rows = json.loads(traind(cfg, "list", "--json").stdout)
        assert [r["tag"] for r in rows] == ["checkpoint-1"]
        client = server.client()
        try:
            assert client.list_multipart_uploads(Bucket="ckpts").get("Uploads", []) == []
        finally:
            client.close()
        pulled = traind(cfg, "pull", "latest", str(tmp_path / "back"))
        assert pulled.returncode == 0, pulled.stderr
    for rel, sha in expected.items():
        data = (tmp_path / "back/checkpoint-1" / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha

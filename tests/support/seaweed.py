"""A real S3-compatible server for tests and benchmarks: SeaweedFS ``weed mini`` on loopback.

``SeaweedS3`` starts ``weed mini`` in its own process group on free 127.0.0.1 ports with
telemetry, WebDAV, the admin UI, Iceberg and Lance switched off, waits until S3 answers a
signed request, and kills the whole group on ``stop()``. It can be stopped and started again
on the same data directory and ports, which is what fault tests need.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.session
from botocore.config import Config
from tests.support.net import free_ports

ACCESS_KEY = "traind-test-access"
SECRET_KEY = "traind-test-secret-key-0123456789"
READONLY_ACCESS_KEY = "traind-test-readonly"
READONLY_SECRET_KEY = "traind-test-readonly-secret-0123"
REGION = "us-east-1"

# Every listener weed mini opens; each gets its own free port (gRPC ports too, since the
# default "port + 10000" may be taken by someone else on a shared machine).
_PORT_FLAGS = (
    "s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port",
    "volume.port.grpc", "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc",
)
# Each bucket is its own collection and takes a volume of its own on its first write. Left
# at 0, weed mini allows free disk / volume size volumes (62 on a 67 GB disk), and a session
# making more buckets than that gets InternalError "no free volumes left" on every write to
# a new one. Volumes are sparse files, so a high fixed count costs no disk.
_MAX_VOLUMES = 4000


def _identities() -> dict[str, Any]:
    return {
        "identities": [
            {
                "name": "admin",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            },
            {
                "name": "reader",
                "credentials": [
                    {"accessKey": READONLY_ACCESS_KEY, "secretKey": READONLY_SECRET_KEY}
                ],
                "actions": ["Read", "List"],
            },
        ]
    }


@dataclass
class SeaweedS3:
    """One ``weed mini`` server rooted at ``root``; ``start()``/``stop()`` may repeat."""

    weed: str
    root: Path
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def storage_toml(self, bucket: str = "ckpts", **keys: str | int | None) -> str:
        """A ``[storage]`` section's keys for ``bucket`` on this server with the test
        credentials, plus ``keys`` (``part_size="5MiB"``; None leaves a key out)."""
        found = {"type": "s3", "bucket": bucket, "endpoint_url": self.endpoint,
                 "region": REGION, "addressing_style": "path", "access_key_id": ACCESS_KEY,
                 "secret_access_key": SECRET_KEY} | keys
        return "".join(f"{k} = {json.dumps(v)}\n" for k, v in found.items() if v is not None)

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        return self.root / "weed.log"

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Any:
        """A synchronous botocore S3 client for setting up and inspecting test state."""
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and return once S3 answers a signed request."""
        if self.proc is not None:
            raise RuntimeError("SeaweedFS is already running")
        first = not self.ports
        for attempt in range(3):
            if first:
                self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
            self._spawn()
            try:
                self._wait_ready(timeout)
                return
            except RuntimeError:
                self.stop()
                # A port taken between choosing it and binding it: choose again.
                if not first or attempt == 2 or "address already in use" not in self._log_tail():
                    raise

    def _spawn(self) -> None:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "identities.json"
        config.write_text(json.dumps(_identities()))
        args = [
            self.weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.config={config}", "-master.telemetry=false", "-webdav=false",
            "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false",
            "-s3.autoCreateBucket=false", f"-volume.max={_MAX_VOLUMES}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"weed mini exited with {self.proc.returncode}:\n{self._log_tail()}"
                    )
                try:
                    client.list_buckets()
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"S3 not ready after {timeout}s:\n{self._log_tail()}"
                        ) from None
                    time.sleep(0.1)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Kill the server's whole process group (as a crash would) and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def volume_limit(self) -> int:
        """How many volumes the master lets the volume server hold (from ``/dir/status``)."""
        url = f"http://127.0.0.1:{self.ports['master.port']}/dir/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(json.load(response)["Topology"]["Max"])

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (idempotent)."""
        client = self.client()
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=name)
        finally:
            client.close()


@contextlib.contextmanager
def running_seaweed(weed: str, root: Path, timeout: float = 30.0) -> Iterator[SeaweedS3]:
    """Start a server under ``root`` for the duration of the block; always kill it."""
    server = SeaweedS3(weed, root)
    try:
        server.start(timeout)
        yield server
    finally:
        server.stop()

"""A real Docker Engine (``dockerd``) for tests, on a unix socket in a temporary directory.

Root only. It runs with no iptables, no bridge and the vfs storage driver, so it needs
neither kernel networking nor overlayfs: containers use network mode ``none`` or ``host``.
Its data root, exec root, pid file and socket all live under one directory; ``stop()``
ends the daemon (and so its containers) and removes the directory, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiodocker
from tests.support.requires import missing, need_binary

START_TIMEOUT = 60.0


class Dockerd:
    """One ``dockerd``; ``host`` is its ``unix://`` address."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            missing("dockerd needs root")
        self.binary = need_binary("dockerd")
        self.root = Path(tempfile.mkdtemp(prefix="traind-dockerd-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start dockerd and wait until its socket answers ``/_ping``."""
        argv = [self.binary, "--iptables=false", "--ip6tables=false", "--bridge=none",
                "--storage-driver=vfs", f"--data-root={self.root}/data",
                f"--exec-root={self.root}/exec", f"--pidfile={self.root}/docker.pid",
                "-H", self.host, "--containerd-namespace=traind-test",
                "--containerd-plugins-namespace=traind-test-plugins"]
        log = (self.root / "dockerd.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not self._pings():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = (self.root / "dockerd.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"dockerd did not start: {said}")
            time.sleep(0.2)

    def _pings(self) -> bool:
        said = subprocess.run(
            ["curl", "-sf", "--max-time", "2", "--unix-socket", str(self.socket),
             "http://d/_ping"], capture_output=True, check=False)
        return said.returncode == 0

    def stop(self) -> None:
        """End dockerd and its process group (containerd and shims), then remove its files."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for mount in _mounts_under(self.root):  # dockerd leaves its netns mounted
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    """Mount points below ``root``, deepest first."""
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(f"{root}/")), key=len, reverse=True)


@contextlib.contextmanager
def running_dockerd() -> Iterator[Dockerd]:
    """A started dockerd, stopped and cleaned up when the block ends however it ends."""
    engine = Dockerd()
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


async def import_rootfs(host: str, tarball: Path, reference: str, path: str) -> None:
    """``POST /images/create?fromSrc=-`` (``docker import``): ``tarball`` as image
    ``reference`` (``repo:tag``) on the engine at ``host``, its PATH ``path``."""
    repo, _, tag = reference.partition(":")
    async with aiodocker.Docker(url=host) as docker:
        with tarball.open("rb") as data:
            async with docker._query(  # aiodocker has `docker load`, not `docker import`
                "images/create", "POST", params={"fromSrc": "-", "repo": repo, "tag": tag,
                                             "changes": f"ENV PATH={path}"},
                data=data, headers={"Content-Type": "application/x-tar"},
            ) as response:
                said = await response.text()
        if '"error"' in said:
            raise RuntimeError(f"docker import of {tarball} failed: {said[-500:]}")
        await docker.images.inspect(reference)


async def labelled(host: str, label: str) -> list[dict[str, object]]:
    """Every container (any state) carrying ``label``, from the engine's own list."""
    async with aiodocker.Docker(url=host) as docker:
        found = await docker.containers.list(all=True, filters={"label": [label]})
        return [c._container for c in found]

"""The ``local`` adapter: this machine is the host. For trying launch out, and for tests.

Provisioning claims ``local-<label>`` in the launch store; "remote" paths are paths here
(relative ones under the home directory, as over SSH); commands run under ``sh -c``.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from traind.launch.base import (
    Constraints,
    Handle,
    HostState,
    HostStatus,
    LineSink,
    Offer,
    RemoteResult,
)
from traind.launch.errors import InstanceNotFoundError
from traind.launch.handles import LaunchStore
from traind.launch.host.commands import check, rsync_argv, run_local, source_and_target
from traind.launch.host.remote import shell_line
from traind.launch.ranking import explain, rank

log = structlog.get_logger("traind.launch")


class LocalBackend:
    """This machine, claimed per launch."""

    name = "local"

    def __init__(self, store: LaunchStore) -> None:
        self.store = store

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """This machine as the one offer (its GPUs as ``nvidia-smi`` lists them)."""
        gpus = await _local_gpus()
        free = shutil.disk_usage(Path.home()).free / 1e9
        offer = Offer(
            backend=self.name, id=socket.gethostname(), gpu_name=gpus[0] if gpus else "",
            num_gpus=len(gpus), price_per_hour=0.0, disk_gb=free,
            download_mbps=float("inf"), reliability=1.0,
        )
        ranked = rank([offer], constraints)
        log.info("launch_offers", backend=self.name, offered=1, matching=len(ranked),
                 gpus=offer.num_gpus, rejected=explain([offer], constraints))
        return ranked

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Claim this machine for ``label`` (image and key do not apply here)."""
        self.store.claim(f"local-{label}", label)
        return Handle(
            backend=self.name, instance_id=f"local-{label}", label=label, offer_id=offer.id,
            gpu_name=offer.gpu_name, num_gpus=offer.num_gpus, created_at=time.time(),
        )

    async def wait_running(self, handle: Handle, timeout: float) -> Handle:  # noqa: ASYNC109
        """Already running, if still claimed."""
        if handle.instance_id not in self.store.claims():
            raise InstanceNotFoundError(f"{handle.instance_id} is not claimed (torn down?)")
        return handle

    async def sync_to(
        self, handle: Handle, local: Path, remote: str, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """rsync on this machine."""
        src, dst, make = source_and_target(local, str(_here(remote)))
        Path(make).mkdir(parents=True, exist_ok=True)
        argv = rsync_argv(src, dst, excludes=excludes, includes=includes, delete=delete)
        check(await run_local(argv, what="rsync"), "rsync")

    async def run_remote(
        self, handle: Handle, command: str | Sequence[str],
        env: Mapping[str, str] | None = None, stream: LineSink | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - kills the remote command
    ) -> RemoteResult:
        """``sh -c`` in the home directory, in its own process group."""
        return await run_local(
            ["sh", "-c", shell_line(command, env)], stream=stream, within=timeout,
            cwd=Path.home(), what="command",
        )

    async def sync_from(
        self, handle: Handle, remote: str, local: Path, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """rsync on this machine."""
        local.mkdir(parents=True, exist_ok=True)
        argv = rsync_argv(f"{_here(remote)}/", f"{local}/", excludes=excludes,
                          includes=includes, delete=delete)
        check(await run_local(argv, what="rsync"), "rsync")

    async def status(self, handle: Handle) -> HostStatus:
        """RUNNING while claimed, else DESTROYED."""
        if handle.instance_id not in self.store.claims():
            return HostStatus(HostState.DESTROYED)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return HostStatus(HostState.RUNNING, handle.gpu_name, handle.num_gpus, uptime)

    async def teardown(self, handle: Handle) -> None:
        """Release the claim; one already released is a warning."""
        if not self.store.release(handle.instance_id):
            log.warning("launch_teardown_already_gone", backend=self.name,
                        instance=handle.instance_id)


def _here(remote: str) -> Path:
    return Path.home() / remote


async def _local_gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    names: list[str] = []
    result = await run_local(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], within=30,
        what="nvidia-smi", stream=names.append,
    )
    return [n.strip() for n in names if n.strip()] if result.exit_code == 0 else []

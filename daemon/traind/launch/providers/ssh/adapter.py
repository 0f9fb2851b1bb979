"""The ``ssh`` adapter: hosts you already have, listed in launch.toml.

The inventory is the offer list (minus hosts another launch holds); provisioning claims a host
in the local launch store and tearing down releases it. Image and public key do not apply:
the host must already accept ``identity_file`` and be in ``known_hosts``.
"""

from __future__ import annotations

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
    SSHEndpoint,
)
from traind.launch.config import SSHHost, SSHSection
from traind.launch.errors import HostUnreachableError, InstanceNotFoundError, RemoteCommandError
from traind.launch.handles import LaunchStore
from traind.launch.host.remote import SSHRemote
from traind.launch.ranking import explain, rank

log = structlog.get_logger("traind.launch")
_PROBE = "cat /proc/uptime; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null"


class SSHBackend:
    """An inventory of SSH hosts, claimed one per launch."""

    name = "ssh"

    def __init__(self, config: SSHSection, store: LaunchStore, identity_file: Path) -> None:
        self.config = config
        self.store = store
        self.identity_file = identity_file

    def _host(self, name: str) -> SSHHost:
        for host in self.config.hosts:
            if host.name == name:
                return host
        raise InstanceNotFoundError(f"host {name!r} is not in the [[ssh.hosts]] inventory")

    def _endpoint(self, host: SSHHost) -> SSHEndpoint:
        return SSHEndpoint(
            host.host, host.port, host.user, str(host.identity_file or self.identity_file),
            str(host.known_hosts),
        )

    def _remote(self, handle: Handle) -> SSHRemote:
        endpoint = handle.endpoint or self._endpoint(self._host(handle.instance_id))
        return SSHRemote(endpoint, self.config.connect_timeout)

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """The unclaimed inventory hosts that satisfy ``constraints``, cheapest first."""
        held = self.store.claims()
        offers = [
            Offer(
                backend=self.name, id=h.name, gpu_name=h.gpu, num_gpus=h.num_gpus,
                price_per_hour=h.price_per_hour, gpu_ram_gb=h.gpu_ram_gb, disk_gb=h.disk_gb,
                download_mbps=h.download_mbps, raw=h.model_dump(mode="json"),
            )
            for h in self.config.hosts
            if h.name not in held
        ]
        ranked = rank(offers, constraints)
        log.info("launch_offers", backend=self.name, offered=len(offers), matching=len(ranked),
                 held=sorted(held), rejected=explain(offers, constraints))
        return ranked

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Claim the host (recorded locally); ProvisionError when another launch holds it."""
        host = self._host(offer.id)
        self.store.claim(host.name, label)
        return Handle(
            backend=self.name, instance_id=host.name, label=label,
            endpoint=self._endpoint(host), offer_id=offer.id, gpu_name=offer.gpu_name,
            num_gpus=offer.num_gpus, price_per_hour=offer.price_per_hour, created_at=time.time(),
        )

    async def wait_running(self, handle: Handle, timeout: float) -> Handle:  # noqa: ASYNC109
        """The host is there already: the launch's ``connect`` step waits until it answers."""
        return handle

    async def sync_to(
        self, handle: Handle, local: Path, remote: str, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """rsync over ssh."""
        await self._remote(handle).sync_to(local, remote, excludes, includes, delete)

    async def run_remote(
        self, handle: Handle, command: str | Sequence[str],
        env: Mapping[str, str] | None = None, stream: LineSink | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - kills the remote command
    ) -> RemoteResult:
        """A command over asyncssh."""
        return await self._remote(handle).run(command, env, stream, within=timeout)

    async def sync_from(
        self, handle: Handle, remote: str, local: Path, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """rsync over ssh."""
        await self._remote(handle).sync_from(remote, local, excludes, includes, delete)

    async def status(self, handle: Handle) -> HostStatus:
        """DESTROYED once released; else RUNNING with uptime and GPUs, or UNKNOWN if unreachable."""
        if handle.instance_id not in self.store.claims():
            return HostStatus(HostState.DESTROYED, endpoint=handle.endpoint)
        lines: list[str] = []
        try:
            await self._remote(handle).run(_PROBE, stream=lines.append, within=30)
        except (HostUnreachableError, RemoteCommandError) as exc:
            return HostStatus(HostState.UNKNOWN, endpoint=handle.endpoint, message=str(exc))
        gpus = [line.strip() for line in lines[1:] if line.strip()]
        uptime = float(lines[0].split()[0]) if lines and lines[0].split() else None
        return HostStatus(
            HostState.RUNNING, gpus[0] if gpus else handle.gpu_name,
            len(gpus) or handle.num_gpus, uptime, handle.endpoint,
        )

    async def teardown(self, handle: Handle) -> None:
        """Release the claim; one already released is a warning."""
        if not self.store.release(handle.instance_id):
            log.warning("launch_teardown_already_gone", backend=self.name,
                        instance=handle.instance_id)

"""What every adapter that rents an instance shares (vast.ai, RunPod, Lambda, Nebius): polling
until it runs, SSH into it with its host key trusted on first use, and a teardown that is
idempotent and confirms the instance is gone.

A subclass says how to look at one instance (``look``), how to destroy it (``destroy``) and
how to search and create; everything else is written here once.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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
from traind.launch.config import CloudSection
from traind.launch.errors import (
    BackendAPIError,
    HostUnreachableError,
    InstanceNotFoundError,
    ProvisionError,
)
from traind.launch.handles import LaunchStore
from traind.launch.host.remote import SSHRemote, trust_on_first_use
from traind.launch.ranking import explain, rank
from traind.util.poll import poll_until

log = structlog.get_logger("traind.launch")


@dataclass(frozen=True)
class Seen:
    """One look at an instance: its state, the provider's word for it, and where SSH answers
    once it runs (empty host while it does not)."""

    state: HostState
    detail: str = ""
    host: str = ""
    port: int = 0
    gpu_name: str = ""
    num_gpus: int = 0
    uptime_seconds: float | None = None


class RentedBackend(ABC):
    """Base of the rented-instance adapters; ``name``, search, provision and the two
    abstract steps come from the subclass."""

    name = "rented"

    def __init__(self, config: CloudSection, store: LaunchStore, identity_file: Path) -> None:
        self.cloud = config
        self.store = store
        self.identity_file = identity_file

    @abstractmethod
    async def look(self, handle: Handle) -> Seen:
        """The instance now; InstanceNotFoundError once it is gone."""

    @abstractmethod
    async def destroy(self, handle: Handle) -> bool:
        """Ask for the instance to be destroyed; False when it was gone already."""

    def ranked(self, offers: list[Offer], constraints: Constraints) -> list[Offer]:
        """The offers that satisfy ``constraints``, best first, with how many fit logged."""
        fitting = rank(offers, constraints)
        log.info("launch_offers", backend=self.name, offered=len(offers), matching=len(fitting),
                 rejected=explain(offers, constraints))
        return fitting

    def rented(self, offer: Offer, instance: str, label: str) -> Handle:
        """The handle of a just-created instance (logged: it costs money from now on)."""
        log.info("launch_instance_created", backend=self.name, instance=instance,
                 offer=offer.id, gpu=offer.gpu_name, price_per_hour=offer.price_per_hour)
        return Handle(
            backend=self.name, instance_id=instance, label=label, offer_id=offer.id,
            gpu_name=offer.gpu_name, num_gpus=offer.num_gpus,
            price_per_hour=offer.price_per_hour, created_at=time.time(),
        )

    async def create_or_find(
        self, create: Callable[[], Awaitable[str]], find: Callable[[], Awaitable[str | None]],
        label: str, what: str,
    ) -> str:
        """The id ``create()`` returns; when its answer is lost (BackendAPIError), the instance
        it may have made, found by label, so it can be torn down; else ProvisionError."""
        try:
            return await create()
        except BackendAPIError as exc:
            try:
                found = await find()
            except BackendAPIError:
                found = None
            if found is None:
                raise ProvisionError(f"{what} failed: {exc}") from exc
            log.warning("launch_create_answer_lost_instance_found", backend=self.name,
                        instance=found, label=label)
            return found

    async def wait_running(self, handle: Handle, timeout: float) -> Handle:  # noqa: ASYNC109
        """Poll until the instance runs with an SSH endpoint; ProvisionError if it stops or
        times out, InstanceNotFoundError if it vanishes."""
        ended = (HostState.STOPPED, HostState.DESTROYED)

        def up(seen: Seen) -> bool:
            return seen.state is HostState.RUNNING and bool(seen.host)

        async def look() -> Seen:
            seen = await self.look(handle)
            if not up(seen) and seen.state not in ended:
                log.info("launch_instance_waiting", backend=self.name,
                         instance=handle.instance_id, state=str(seen.state), detail=seen.detail)
            return seen

        seen = await poll_until(look, done=lambda s: up(s) or s.state in ended, within=timeout,
                                every=self.cloud.poll_interval)
        if seen.state in ended:
            raise ProvisionError(
                f"{self.name} instance {handle.instance_id} did not start ({seen.detail})")
        if not up(seen):
            raise ProvisionError(f"{self.name} instance {handle.instance_id} not running after "
                                 f"{timeout:.0f}s ({seen.detail})")
        endpoint = SSHEndpoint(
            seen.host, seen.port or self.cloud.ssh_port, self.cloud.ssh_user,
            str(self.identity_file), str(self.store.known_hosts(handle.label)),
        )
        return replace(handle, endpoint=endpoint)

    async def status(self, handle: Handle) -> HostStatus:
        """The instance's state from the provider; DESTROYED once it is gone."""
        try:
            seen = await self.look(handle)
        except InstanceNotFoundError:
            return HostStatus(HostState.DESTROYED, endpoint=handle.endpoint)
        return HostStatus(
            seen.state, seen.gpu_name or handle.gpu_name, seen.num_gpus or handle.num_gpus,
            seen.uptime_seconds, handle.endpoint, seen.detail,
        )

    async def teardown(self, handle: Handle) -> None:
        """Destroy the instance and wait until the provider no longer has it; one already
        gone is a warning. BackendAPIError when it is still there after teardown_timeout."""
        if not await self.destroy(handle):
            log.warning("launch_teardown_already_gone", backend=self.name,
                        instance=handle.instance_id, detail="not found")
            return

        async def left() -> Seen | None:
            try:
                seen = await self.look(handle)
            except InstanceNotFoundError:
                return None
            return None if seen.state is HostState.DESTROYED else seen

        seen = await poll_until(left, done=lambda s: s is None,
                                within=self.cloud.teardown_timeout, every=self.cloud.poll_interval)
        if seen is not None:
            raise BackendAPIError(
                f"{self.name} instance {handle.instance_id} still {seen.state} "
                f"({seen.detail}) {self.cloud.teardown_timeout:.0f}s after its deletion"
            )
        log.info("launch_instance_destroyed", backend=self.name, instance=handle.instance_id)

    async def _remote(self, handle: Handle) -> SSHRemote:
        if handle.endpoint is None:
            raise HostUnreachableError(f"instance {handle.instance_id} has no SSH endpoint yet")
        await trust_on_first_use(handle.endpoint)
        return SSHRemote(handle.endpoint)

    async def sync_to(
        self, handle: Handle, local: Path, remote: str, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """rsync over ssh."""
        await (await self._remote(handle)).sync_to(local, remote, excludes, includes, delete)

    async def run_remote(
        self, handle: Handle, command: str | Sequence[str],
        env: Mapping[str, str] | None = None, stream: LineSink | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - kills the remote command
    ) -> RemoteResult:
        """A command over asyncssh."""
        return await (await self._remote(handle)).run(command, env, stream, within=timeout)

    async def sync_from(
        self, handle: Handle, remote: str, local: Path, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """rsync over ssh."""
        await (await self._remote(handle)).sync_from(remote, local, excludes, includes, delete)

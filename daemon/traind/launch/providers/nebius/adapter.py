"""The ``nebius`` adapter: Nebius AI Cloud through its official Python SDK (``nebius``, gRPC),
then SSH into the instance.

RPCs used: ``compute.v1.PlatformService/List`` (GPU platforms and their presets),
``billing.v1alpha1.CalculatorService/Estimate`` (the hourly price of a preset),
``compute.v1.InstanceService/Create`` (resources = platform + preset, a managed boot disk from
an image family, which is deleted with the instance, one interface with a public IP, our key
in cloud-init), ``Get``, ``GetByName`` (an instance whose create answer was lost) and
``Delete``, with the operations they return followed to their end
(``common.v1.OperationService/Get``). Credentials are the SDK's own: ``$NEBIUS_IAM_TOKEN``, else
the nebius CLI's profile (``~/.nebius/config.yaml``), whose parent-id is the default project.
The SDK is imported only when this backend is chosen.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from traind.errors import ConfigError
from traind.launch.base import Constraints, Handle, HostState, Offer
from traind.launch.config import NebiusSection
from traind.launch.errors import BackendAPIError, InstanceNotFoundError, ProvisionError
from traind.launch.handles import LaunchStore
from traind.launch.providers.nebius.api import (
    cloud_init,
    gpu_name,
    kind_of,
    normalise_state,
    offer,
    public_address,
)
from traind.launch.providers.rented import RentedBackend, Seen
from traind.util.retry import Backoff, retrying

if TYPE_CHECKING:
    from nebius.aio.service_error import RequestError
    from nebius.api.nebius.compute.v1 import CreateInstanceRequest
    from nebius.sdk import SDK

log = structlog.get_logger("traind.launch")
T = TypeVar("T")
CLI_CONFIG = Path("~/.nebius/config.yaml")


class _Failed(BackendAPIError):
    """A failed call, with what it means (nebius_api.kind_of)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _translate(exc: RequestError, what: str) -> _Failed:
    status = exc.status
    details = {name: any(getattr(e, name, None) is not None for e in status.service_errors)
               for name in ("too_many_requests", "not_enough_resources", "quota_failure")}
    return _Failed(f"nebius {what}: {exc}", kind_of(status.code.name, details))


def _hourly(estimate: Any) -> float:
    """The hourly total of a calculator estimate (absent parts are 0)."""
    general = estimate.hourly_cost.general if estimate.hourly_cost else None
    total = general.total if general else None
    return float(total.cost) if total and total.cost else 0.0


class NebiusBackend(RentedBackend):
    """Nebius compute instances with GPUs, created per launch."""

    name = "nebius"

    def __init__(self, config: NebiusSection, store: LaunchStore, identity_file: Path) -> None:
        super().__init__(config, store, identity_file)
        self.config = config

    @contextlib.asynccontextmanager
    async def _sdk(self) -> AsyncIterator[SDK]:
        from nebius.aio.cli_config import Config
        from nebius.base.options import INSECURE
        from nebius.base.resolver import Constant
        from nebius.sdk import SDK

        cfg = self.config
        kwargs: dict[str, Any] = {"user_agent_prefix": "traind-launch"}
        if not cfg.tls:
            kwargs |= {"resolver": Constant(cfg.endpoint), "options": [(INSECURE, True)]}
        elif cfg.endpoint:
            kwargs["domain"] = cfg.endpoint
        if not os.environ.get("NEBIUS_IAM_TOKEN") and CLI_CONFIG.expanduser().is_file():
            kwargs["config_reader"] = Config()
        async with SDK(**kwargs) as sdk:
            yield sdk

    def _project(self) -> str:
        if self.config.project_id:
            return self.config.project_id
        if CLI_CONFIG.expanduser().is_file():
            from nebius.aio.cli_config import Config

            return Config().parent_id
        raise ConfigError(["nebius.project_id: missing (set it, or the nebius CLI profile's "
                           "parent-id)"])

    async def _call(self, what: str, make: Callable[[], Awaitable[T]], idempotent: bool) -> T:
        """One RPC through the shared retry loop: a rate limit is waited out, a transient
        failure of a read or delete retried; the SDK's own retries are off."""
        from nebius.aio.service_error import RequestError

        async def attempt() -> T:
            try:
                return await make()
            except RequestError as exc:
                raise _translate(exc, what) from exc

        def passing(exc: BaseException) -> bool:
            kind = exc.kind if isinstance(exc, _Failed) else ""
            return kind == "rate" or (idempotent and kind == "transient")

        def logged(exc: BaseException, n: int, delay: float) -> None:
            if isinstance(exc, _Failed) and exc.kind == "rate":
                log.info("launch_api_waiting", backend=self.name, path=what,
                         reason="rate limited (RESOURCE_EXHAUSTED)", seconds=round(delay, 3))
            else:
                log.warning("launch_api_retry", backend=self.name, method="grpc", path=what,
                            attempt=n, retry_in=delay, error=str(exc))

        cfg = self.config
        return await retrying(attempt, Backoff(cfg.backoff_initial, cfg.backoff_max),
                              cfg.retries, passing, logged)

    def _rpc(self) -> dict[str, Any]:
        return {"retries": 0, "timeout": self.config.request_timeout}

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """Every GPU preset of the project's platforms, priced by the billing calculator."""
        from nebius.api.nebius.billing.v1alpha1 import (
            CalculatorServiceClient,
            EstimateRequest,
            ResourceSpec,
        )
        from nebius.api.nebius.common.v1 import ResourceMetadata
        from nebius.api.nebius.compute.v1 import (
            CreateInstanceRequest,
            InstanceSpec,
            ListPlatformsRequest,
            PlatformServiceClient,
            ResourcesSpec,
        )

        project = self._project()
        offers = []
        async with self._sdk() as sdk:
            platforms = await self._call("PlatformService/List", lambda: PlatformServiceClient(
                sdk).list(ListPlatformsRequest(parent_id=project, page_size=100), **self._rpc()),
                idempotent=True)
            calculator = CalculatorServiceClient(sdk)
            for platform in platforms.items:
                pname = platform.metadata.name
                if self.config.platforms and pname not in self.config.platforms:
                    continue
                spec = platform.spec
                for preset in spec.presets:
                    res = preset.resources
                    if res.gpu_count < 1:
                        continue
                    request = EstimateRequest(resource_spec=ResourceSpec(
                        compute_instance_spec=CreateInstanceRequest(
                            metadata=ResourceMetadata(parent_id=project),
                            spec=InstanceSpec(resources=ResourcesSpec(platform=pname,
                                                                      preset=preset.name)))))
                    estimate = await self._call(
                        "CalculatorService/Estimate",
                        lambda r=request: calculator.estimate(r, **self._rpc()),  # type: ignore[misc]
                        idempotent=True)
                    offers.append(offer(
                        pname, preset.name,
                        gpu_name(spec.short_human_readable_name, spec.human_readable_name, pname),
                        res.gpu_count, res.gpu_memory_gibibytes or spec.gpu_memory_gibibytes,
                        _hourly(estimate),
                    ))
        return self.ranked(offers, constraints)

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Create the instance and follow its operation; ProvisionError naming Nebius's reason
        (quota, not enough resources), with whatever it left behind deleted."""
        from nebius.aio.operation import OperationError
        from nebius.api.nebius.common.v1 import GetByNameRequest
        from nebius.api.nebius.compute.v1 import InstanceServiceClient

        cfg, project = self.config, self._project()
        request = self._create_request(offer, disk, ssh_public_key, label)
        async with self._sdk() as sdk:
            service = InstanceServiceClient(sdk)

            async def create() -> str:
                try:
                    operation = await self._call(
                        "InstanceService/Create", lambda: service.create(request, **self._rpc()),
                        idempotent=False)
                except _Failed as exc:
                    if exc.kind in ("quota", "capacity", "auth", "other"):
                        raise ProvisionError(f"nebius refused {offer.id}: {exc}") from exc
                    raise
                try:
                    await operation.wait(interval=cfg.poll_interval,
                                         timeout=cfg.teardown_timeout)
                except (OperationError, TimeoutError) as exc:
                    if operation.resource_id:  # made, but failed or never finished: not kept
                        await self._delete(sdk, operation.resource_id)
                    raise ProvisionError(f"nebius could not create {offer.id}: "
                                         f"{exc or 'timed out'}") from exc
                return str(operation.resource_id)

            async def find() -> str | None:
                try:
                    found = await self._call("InstanceService/GetByName", lambda: service
                                             .get_by_name(GetByNameRequest(parent_id=project,
                                                                           name=label),
                                                          **self._rpc()), idempotent=True)
                except _Failed as exc:
                    if exc.kind == "missing":
                        return None
                    raise
                return str(found.metadata.id)

            instance = await self.create_or_find(create, find, label, "nebius create instance")
        return self.rented(offer, instance, label)

    def _create_request(self, offer: Offer, disk: float, ssh_public_key: str,
                        label: str) -> CreateInstanceRequest:
        """The instance of ``offer``: its boot disk from the configured image family, a
        public IP, and cloud-init that lets ``ssh_public_key`` in."""
        from nebius.api.nebius.common.v1 import ResourceMetadata
        from nebius.api.nebius.compute.v1 import (
            AttachedDiskSpec,
            CreateInstanceRequest,
            DiskSpec,
            InstanceSpec,
            IPAddress,
            ManagedDisk,
            NetworkInterfaceSpec,
            PublicIPAddress,
            ResourcesSpec,
            SourceImageFamily,
        )

        cfg = self.config
        return CreateInstanceRequest(
            metadata=ResourceMetadata(parent_id=self._project(), name=label),
            spec=InstanceSpec(
                resources=ResourcesSpec(platform=offer.raw["platform"], preset=offer.raw["preset"]),
                boot_disk=AttachedDiskSpec(
                    attach_mode=AttachedDiskSpec.AttachMode.READ_WRITE,
                    managed_disk=ManagedDisk(name=f"{label}-boot", spec=DiskSpec(
                        size_gibibytes=math.ceil(disk / 1.073741824),
                        type=getattr(DiskSpec.DiskType, cfg.disk_type.upper()),
                        source_image_family=SourceImageFamily(image_family=cfg.image_family),
                    )),
                ),
                network_interfaces=[NetworkInterfaceSpec(
                    name="eth0", subnet_id=cfg.subnet_id, ip_address=IPAddress(),
                    public_ip_address=PublicIPAddress(),
                )],
                cloud_init_user_data=cloud_init(cfg.ssh_user, ssh_public_key),
            ),
        )

    async def look(self, handle: Handle) -> Seen:
        """``InstanceService/Get``: state, public IP, GPUs."""
        from nebius.api.nebius.compute.v1 import GetInstanceRequest, InstanceServiceClient

        async with self._sdk() as sdk:
            try:
                instance = await self._call("InstanceService/Get", lambda: InstanceServiceClient(
                    sdk).get(GetInstanceRequest(id=handle.instance_id), **self._rpc()),
                    idempotent=True)
            except _Failed as exc:
                if exc.kind == "missing":
                    raise InstanceNotFoundError(str(exc)) from exc
                raise
        state = instance.status.state.name
        host = public_address(
            (n.public_ip_address.address if n.public_ip_address else "")
            for n in instance.status.network_interfaces
        ) if normalise_state(state) is HostState.RUNNING else ""
        return Seen(normalise_state(state), state, host, 0, instance.spec.resources.platform)

    async def _delete(self, sdk: SDK, instance: str) -> bool:
        from nebius.aio.operation import OperationError
        from nebius.api.nebius.compute.v1 import DeleteInstanceRequest, InstanceServiceClient

        try:
            operation = await self._call("InstanceService/Delete", lambda: InstanceServiceClient(
                sdk).delete(DeleteInstanceRequest(id=instance), **self._rpc()), idempotent=True)
        except _Failed as exc:
            if exc.kind == "missing":
                return False
            raise
        try:
            await operation.wait(interval=self.config.poll_interval,
                                 timeout=self.config.teardown_timeout)
        except (OperationError, TimeoutError) as exc:
            raise BackendAPIError(f"nebius delete {instance}: {exc or 'timed out'}") from exc
        return True

    async def destroy(self, handle: Handle) -> bool:
        """``InstanceService/Delete``, its operation followed to the end (the managed boot
        disk goes with the instance)."""
        async with self._sdk() as sdk:
            return await self._delete(sdk, handle.instance_id)

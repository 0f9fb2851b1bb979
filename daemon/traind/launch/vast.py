"""The ``vast`` adapter: vast.ai's REST API over aiohttp, then SSH into the instance.

Endpoints used (``[vast] url`` is the base, so tests use a stand-in): ``GET /api/v0/bundles/``
(search, query JSON in ``q``), ``PUT /api/v0/asks/{offer}/`` (create), ``POST
/api/v0/instances/{id}/ssh/`` (attach our key), ``GET /api/v0/instances/{id}/`` (show),
``GET /api/v0/instances/`` (list, to find an instance whose create answer was lost) and
``DELETE /api/v0/instances/{id}/`` (destroy). The API key travels only in the Authorization
header and is never logged. Reads and deletes are retried on 5xx, 429 and connection errors;
a create is not (it would rent twice) — after a failed one the instance is looked up by label.
Instances' host keys cannot be known in advance: they are trusted on first use, per launch.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from traind.launch.config import VastSection
from traind.launch.errors import (
    BackendAPIError,
    HostUnreachableError,
    InstanceNotFoundError,
    ProvisionError,
)
from traind.launch.handles import LaunchStore
from traind.launch.ranking import explain, rank
from traind.launch.remote import SSHRemote, trust_on_first_use
from traind.launch.vast_api import (
    VastAPI,
    is_missing,
    message,
    normalise_state,
    offer_from,
    search_query,
)

log = structlog.get_logger("traind.launch")

class VastBackend:
    """vast.ai instances, rented per launch."""

    name = "vast"

    def __init__(self, config: VastSection, store: LaunchStore, identity_file: Path) -> None:
        self.config = config
        self.store = store
        self.identity_file = identity_file
        self.api = VastAPI(config)

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """Offers filtered by the server, then again here, cheapest first."""
        q = search_query(constraints, self.config.verified_only, self.config.search_limit)
        status, data = await self.api.call("GET", "/api/v0/bundles/", params={"q": json.dumps(q)})
        if status >= 400:
            raise BackendAPIError(f"vast.ai search failed: HTTP {status}: {message(data)}")
        offers = [offer_from(r) for r in data.get("offers") or [] if "id" in r]
        ranked = rank(offers, constraints)
        log.info("launch_offers", backend=self.name, offered=len(offers), matching=len(ranked),
                 rejected=explain(offers, constraints))
        return ranked

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Create an instance from ``offer`` and attach our key; ProvisionError when refused."""
        body = {"client_id": "me", "image": image, "disk": disk, "label": label,
                "runtype": "ssh"}
        try:
            status, data = await self.api.call(
                "PUT", f"/api/v0/asks/{offer.id}/", body=body, retry=False
            )
        except BackendAPIError as exc:
            found = await self._find_by_label(label)
            if found is None:
                raise ProvisionError(f"vast.ai create from offer {offer.id} failed: {exc}") from exc
            log.warning("vast_create_answer_lost_instance_found", instance=found, label=label)
            status, data = 200, {"success": True, "new_contract": found}
        if status >= 400 or not data.get("success") or "new_contract" not in data:
            raise ProvisionError(
                f"vast.ai refused offer {offer.id}: {message(data)} (HTTP {status})"
            )
        handle = Handle(
            backend=self.name, instance_id=str(data["new_contract"]), label=label,
            offer_id=offer.id, gpu_name=offer.gpu_name, num_gpus=offer.num_gpus,
            price_per_hour=offer.price_per_hour, created_at=time.time(),
        )
        log.info("vast_instance_created", instance=handle.instance_id, offer=offer.id,
                 gpu=offer.gpu_name, price_per_hour=offer.price_per_hour)
        try:
            await self._attach_key(handle.instance_id, ssh_public_key)
        except BackendAPIError as exc:
            await self.teardown(handle)
            raise ProvisionError(
                f"could not attach the SSH key to instance {handle.instance_id} "
                f"(destroyed it): {exc}"
            ) from exc
        return handle

    async def _attach_key(self, instance: str, public_key: str) -> None:
        status, data = await self.api.call(
            "POST", f"/api/v0/instances/{instance}/ssh/", body={"ssh_key": public_key}
        )
        if status >= 400 or data.get("success") is False:
            raise BackendAPIError(f"HTTP {status}: {message(data)}")

    async def _find_by_label(self, label: str) -> str | None:
        try:
            status, data = await self.api.call("GET", "/api/v0/instances/")
        except BackendAPIError:
            return None
        records = data.get("instances") if status < 400 and isinstance(data, dict) else None
        ids = [str(r["id"]) for r in records or [] if r.get("label") == label and "id" in r]
        return ids[0] if ids else None

    async def _show(self, instance: str) -> dict[str, Any]:
        status, data = await self.api.call("GET", f"/api/v0/instances/{instance}/")
        record = data.get("instances") if isinstance(data, dict) else None
        if isinstance(record, list):
            record = record[0] if record else None
        if status == 404 or not record:
            raise InstanceNotFoundError(f"vast.ai instance {instance} does not exist (any more)")
        if status >= 400:
            raise BackendAPIError(f"vast.ai show {instance}: HTTP {status}: {message(data)}")
        return dict(record)

    async def wait_running(self, handle: Handle, timeout: float) -> Handle:  # noqa: ASYNC109
        """Poll until the instance runs with an SSH endpoint; ProvisionError if it fails or
        times out, InstanceNotFoundError if it vanishes."""
        deadline = time.monotonic() + timeout
        while True:
            record = await self._show(handle.instance_id)
            state = normalise_state(record)
            if state is HostState.RUNNING and record.get("ssh_host") and record.get("ssh_port"):
                endpoint = SSHEndpoint(
                    str(record["ssh_host"]), int(record["ssh_port"]), self.config.ssh_user,
                    str(self.identity_file), str(self.store.known_hosts(handle.label)),
                )
                return replace(handle, endpoint=endpoint)
            detail = f"{record.get('actual_status')}: {record.get('status_msg') or ''}".strip()
            if state in (HostState.STOPPED, HostState.DESTROYED):
                raise ProvisionError(f"instance {handle.instance_id} did not start ({detail})")
            if time.monotonic() >= deadline:
                raise ProvisionError(
                    f"instance {handle.instance_id} not running after {timeout:.0f}s ({detail})"
                )
            log.info("vast_instance_waiting", instance=handle.instance_id, state=str(state),
                     detail=detail)
            await asyncio.sleep(min(self.config.poll_interval, deadline - time.monotonic()))

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

    async def status(self, handle: Handle) -> HostStatus:
        """The instance's state from the API; DESTROYED once it is gone."""
        try:
            record = await self._show(handle.instance_id)
        except InstanceNotFoundError:
            return HostStatus(HostState.DESTROYED, endpoint=handle.endpoint)
        uptime = record.get("uptime_mins")
        start = record.get("start_date")
        seconds = (float(uptime) * 60 if uptime is not None
                   else time.time() - float(start) if start else None)
        return HostStatus(
            normalise_state(record), str(record.get("gpu_name") or handle.gpu_name),
            int(record.get("num_gpus") or handle.num_gpus), seconds, handle.endpoint,
            str(record.get("status_msg") or ""),
        )

    async def teardown(self, handle: Handle) -> None:
        """Destroy the instance; one already gone is a warning."""
        status, data = await self.api.call("DELETE", f"/api/v0/instances/{handle.instance_id}/")
        if status == 404 or (data.get("success") is False and is_missing(data)):
            log.warning("launch_teardown_already_gone", backend=self.name,
                        instance=handle.instance_id, detail=message(data))
            return
        if status >= 400 or data.get("success") is False:
            raise BackendAPIError(
                f"vast.ai destroy {handle.instance_id}: HTTP {status}: {message(data)}"
            )
        log.info("vast_instance_destroyed", instance=handle.instance_id)

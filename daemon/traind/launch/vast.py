"""The ``vast`` adapter: vast.ai's REST API over aiohttp, then SSH into the instance.

Endpoints used (``[vast] url`` is the base, so tests use a stand-in): ``GET /api/v0/bundles/``
(search, query JSON in ``q``), ``PUT /api/v0/asks/{offer}/`` (create), ``POST
/api/v0/instances/{id}/ssh/`` (attach our key), ``GET /api/v0/instances/{id}/`` (show),
``GET /api/v0/instances/`` (list, to find an instance whose create answer was lost) and
``DELETE /api/v0/instances/{id}/`` (destroy). The API key travels only in the Authorization
header and is never logged. Instances' host keys cannot be known in advance: they are trusted
on first use, per launch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from traind.launch.base import Constraints, Handle, HostState, Offer
from traind.launch.config import VastSection
from traind.launch.errors import BackendAPIError, InstanceNotFoundError, ProvisionError
from traind.launch.handles import LaunchStore
from traind.launch.providers.rented import RentedBackend, Seen
from traind.launch.providers.rest import RestAPI, bearer
from traind.launch.providers.vast.api import (
    is_missing,
    message,
    normalise_state,
    offer_from,
    search_query,
)


class VastBackend(RentedBackend):
    """vast.ai instances, rented per launch."""

    name = "vast"

    def __init__(self, config: VastSection, store: LaunchStore, identity_file: Path) -> None:
        super().__init__(config, store, identity_file)
        self.config = config
        self.api = RestAPI(self.name, config.url, config, bearer(config.key))

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """Offers filtered by the server, then again here, cheapest first."""
        q = search_query(constraints, self.config.verified_only, self.config.search_limit)
        status, data = await self.api.call("GET", "/api/v0/bundles/", params={"q": json.dumps(q)})
        if status >= 400:
            raise BackendAPIError(f"vast.ai search failed: HTTP {status}: {message(data)}")
        offers = [offer_from(r) for r in data.get("offers") or [] if "id" in r]
        return self.ranked(offers, constraints)

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Create an instance from ``offer`` and attach our key; ProvisionError when refused."""
        body = {"client_id": "me", "image": image, "disk": disk, "label": label,
                "runtype": "ssh"}

        async def create() -> str:
            status, data = await self.api.call(
                "PUT", f"/api/v0/asks/{offer.id}/", body=body, retry=False
            )
            if status >= 400 or not data.get("success") or "new_contract" not in data:
                raise ProvisionError(
                    f"vast.ai refused offer {offer.id}: {message(data)} (HTTP {status})"
                )
            return str(data["new_contract"])

        instance = await self.create_or_find(
            create, lambda: self._find_by_label(label), label,
            f"vast.ai create from offer {offer.id}",
        )
        handle = self.rented(offer, instance, label)
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
        status, data = await self.api.call("GET", "/api/v0/instances/")
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

    async def look(self, handle: Handle) -> Seen:
        """``GET /api/v0/instances/{id}/``: state, SSH host and port, GPUs, uptime."""
        record = await self._show(handle.instance_id)
        state = normalise_state(record)
        uptime = record.get("uptime_mins")
        start = record.get("start_date")
        ready = state is HostState.RUNNING and record.get("ssh_host") and record.get("ssh_port")
        return Seen(
            state, f"{record.get('actual_status')}: {record.get('status_msg') or ''}".strip(),
            str(record["ssh_host"]) if ready else "", int(record["ssh_port"]) if ready else 0,
            str(record.get("gpu_name") or ""), int(record.get("num_gpus") or 0),
            float(uptime) * 60 if uptime is not None
            else time.time() - float(start) if start else None,
        )

    async def destroy(self, handle: Handle) -> bool:
        """``DELETE /api/v0/instances/{id}/``."""
        status, data = await self.api.call("DELETE", f"/api/v0/instances/{handle.instance_id}/")
        if status == 404 or (data.get("success") is False and is_missing(data)):
            return False
        if status >= 400 or data.get("success") is False:
            raise BackendAPIError(
                f"vast.ai destroy {handle.instance_id}: HTTP {status}: {message(data)}"
            )
        return True

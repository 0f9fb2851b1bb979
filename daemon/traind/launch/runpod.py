"""The ``runpod`` adapter: RunPod's REST API v2 over aiohttp, then SSH into the pod.

Endpoints used (``[runpod] url`` is the base): ``GET /v2/catalog/gpus?include=AVAILABILITY&
product=POD`` (GPU types with per-GPU prices and stock per data center), ``POST /v2/pods``
(create), ``GET /v2/pods/{id}`` (status and port mappings), ``GET /v2/pods`` (find a pod whose
create answer was lost, by name) and ``DELETE /v2/pods/{id}`` (terminate). The older REST v1
and GraphQL APIs are not used. The pod is created with ``startSsh`` and our public key as its
``PUBLIC_KEY`` (so the account's registered keys are left alone) and ``22/tcp`` exposed; SSH
goes to the public side of that mapping. The API key travels only in the Authorization header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traind.launch.base import Constraints, Handle, HostState, Offer
from traind.launch.config import RunPodSection
from traind.launch.errors import BackendAPIError, ProvisionError
from traind.launch.handles import LaunchStore
from traind.launch.providers.rented import RentedBackend, Seen
from traind.launch.providers.rest import RestAPI, bearer
from traind.launch.providers.runpod.api import message, normalise_state, offers_from, ssh_address


class RunPodBackend(RentedBackend):
    """RunPod GPU pods, created per launch."""

    name = "runpod"

    def __init__(self, config: RunPodSection, store: LaunchStore, identity_file: Path) -> None:
        super().__init__(config, store, identity_file)
        self.config = config
        self.api = RestAPI(self.name, config.url, config, bearer(config.key))

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """GPU types with stock for the wanted count, per data center, cheapest first."""
        count = max(1, constraints.num_gpus)
        status, data = await self.api.call("GET", "/v2/catalog/gpus", params={
            "include": "AVAILABILITY", "product": "POD", "count": str(count),
            "cloud": self.config.cloud,
        })
        if status >= 400:
            raise BackendAPIError(f"runpod catalog: HTTP {status}: {message(data)}")
        offers = offers_from(data.get("gpus") or [], self.config.cloud, count,
                             self.config.data_centers)
        return self.ranked(offers, constraints)

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Create a pod on the offer's GPU type and data center; ProvisionError naming
        RunPod's reason when refused (no capacity, balance, access)."""
        gpu, dc = offer.raw["gpu"], offer.raw["dataCenter"]
        body: dict[str, Any] = {
            "name": label, "image": image, "gpu": {"id": gpu["id"], "count": offer.num_gpus},
            "cloud": self.config.cloud, "dataCenterIds": [dc["id"]], "disk": max(1, round(disk)),
            "ports": [f"{self.config.ssh_port}/tcp"], "startSsh": True,
            "env": {"PUBLIC_KEY": ssh_public_key},
        }

        async def create() -> str:
            status, data = await self.api.call("POST", "/v2/pods", body=body, retry=False)
            if status >= 400 or "id" not in data:
                raise ProvisionError(
                    f"runpod refused a pod of {offer.num_gpus}x {gpu['id']} in {dc['id']}: "
                    f"{message(data)} (HTTP {status})"
                )
            return str(data["id"])

        instance = await self.create_or_find(create, lambda: self._find(label), label,
                                             "runpod create pod")
        return self.rented(offer, instance, label)

    async def _find(self, name: str) -> str | None:
        status, data = await self.api.call("GET", "/v2/pods")
        pods = data.get("pods") if status < 400 and isinstance(data, dict) else None
        ids = [str(p["id"]) for p in pods or [] if p.get("name") == name
               and normalise_state(p) is not HostState.DESTROYED]
        return ids[0] if ids else None

    async def look(self, handle: Handle) -> Seen:
        """``GET /v2/pods/{id}``: status, the SSH port mapping, GPUs, uptime."""
        pod = await self.api.read(f"/v2/pods/{handle.instance_id}",
                                  f"pod {handle.instance_id}", message)
        state = normalise_state(pod)
        address = ssh_address(pod, self.config.ssh_port) if state is HostState.RUNNING else None
        gpu = pod.get("gpu") or {}
        uptime = (pod.get("runtime") or {}).get("uptime")
        return Seen(state, str(pod.get("status")), *(address or ("", 0)), str(gpu.get("id", "")),
                    int(gpu.get("count") or 0), float(uptime) if uptime is not None else None)

    async def destroy(self, handle: Handle) -> bool:
        """``DELETE /v2/pods/{id}`` (terminate: compute and its disk are released)."""
        status, data = await self.api.call("DELETE", f"/v2/pods/{handle.instance_id}")
        if status == 404:
            return False
        if status >= 400:
            raise BackendAPIError(f"runpod delete pod {handle.instance_id}: HTTP {status}: "
                                  f"{message(data)}")
        return True

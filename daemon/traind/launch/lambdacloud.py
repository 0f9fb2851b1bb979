"""The ``lambda`` adapter: Lambda Cloud's public REST API v1 over aiohttp, then SSH into the
instance.

Endpoints used (``[lambda] url`` is the base): ``GET /api/v1/instance-types`` (types, prices
and regions with capacity), ``GET`` and ``POST /api/v1/ssh-keys`` (our public key, registered
once under a name derived from it), ``POST /api/v1/instance-operations/launch``, ``GET
/api/v1/instances/{id}``, ``GET /api/v1/instances`` (find an instance whose launch answer was
lost, by name) and ``POST /api/v1/instance-operations/terminate``. Lambda allows about one
request per second and one launch per twelve seconds: requests are paced to that
(``request_interval``, ``launch_interval``) and every wait is logged. The key travels only in
the Authorization header. Instances run sshd on port 22 of their public IP.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from traind.launch.base import Constraints, Handle, HostState, Offer
from traind.launch.config import LambdaSection
from traind.launch.errors import BackendAPIError, ProvisionError
from traind.launch.handles import LaunchStore
from traind.launch.providers.lambda_cloud.api import (
    error_code,
    message,
    normalise_state,
    offers_from,
)
from traind.launch.providers.rented import RentedBackend, Seen
from traind.launch.providers.rest import RestAPI, bearer

LAUNCH = "/api/v1/instance-operations/launch"


def key_name(public_key: str) -> str:
    """The name our key is registered under: ``traind-`` and 12 hex digits of its sha256."""
    blob = public_key.split()[1] if len(public_key.split()) > 1 else public_key
    return "traind-" + hashlib.sha256(base64.b64decode(blob + "==")).hexdigest()[:12]


class LambdaBackend(RentedBackend):
    """Lambda On-Demand Cloud instances, launched per launch."""

    name = "lambda"

    def __init__(self, config: LambdaSection, store: LaunchStore, identity_file: Path) -> None:
        super().__init__(config, store, identity_file)
        self.config = config
        self.api = RestAPI(
            self.name, config.url, config,
            bearer(config.key),
            paces=[("", config.request_interval), (LAUNCH, config.launch_interval)],
        )

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """Instance types with capacity, per region, cheapest first."""
        status, data = await self.api.call("GET", "/api/v1/instance-types")
        if status >= 400:
            raise BackendAPIError(f"lambda instance types: HTTP {status}: {message(data)}")
        offers = offers_from(data.get("data") or {}, self.config.regions)
        return self.ranked(offers, constraints)

    async def _ssh_key(self, public_key: str) -> str:
        """The name of our key in the account, registering it if it is not there yet."""
        wanted = public_key.split()[:2]
        status, data = await self.api.call("GET", "/api/v1/ssh-keys")
        if status >= 400:
            raise ProvisionError(f"lambda ssh keys: {message(data)} (HTTP {status})")
        for key in data.get("data") or []:
            if str(key.get("public_key", "")).split()[:2] == wanted:
                return str(key["name"])
        name = key_name(public_key)
        status, data = await self.api.call(
            "POST", "/api/v1/ssh-keys", body={"name": name, "public_key": public_key}, retry=False
        )
        if status >= 400:
            raise ProvisionError(f"lambda refused our SSH key: {message(data)} (HTTP {status})")
        return name

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Launch one instance of the offer's type in its region with our key; ProvisionError
        naming Lambda's reason (insufficient capacity, quota, account)."""
        ssh_key = await self._ssh_key(ssh_public_key)
        kind, region = offer.raw["instance_type"], offer.raw["region"]["name"]
        body = {"region_name": region, "instance_type_name": kind, "ssh_key_names": [ssh_key],
                "name": label}

        async def create() -> str:
            status, data = await self.api.call("POST", LAUNCH, body=body, retry=False)
            ids = (data.get("data") or {}).get("instance_ids") if status < 400 else None
            if not ids:
                raise ProvisionError(f"lambda refused {kind} in {region}: {message(data)} "
                                     f"(HTTP {status})")
            return str(ids[0])

        instance = await self.create_or_find(create, lambda: self._find(label), label,
                                             "lambda launch")
        return self.rented(offer, instance, label)

    async def _find(self, name: str) -> str | None:
        status, data = await self.api.call("GET", "/api/v1/instances")
        found = [str(i["id"]) for i in (data.get("data") or [] if status < 400 else [])
                 if i.get("name") == name and normalise_state(i) is not HostState.DESTROYED]
        return found[0] if found else None

    async def look(self, handle: Handle) -> Seen:
        """``GET /api/v1/instances/{id}``: status, public IP, GPUs."""
        data = await self.api.read(f"/api/v1/instances/{handle.instance_id}",
                                   f"instance {handle.instance_id}", message)
        instance = data.get("data") or {}
        state = normalise_state(instance)
        kind = instance.get("instance_type") or {}
        host = str(instance.get("ip") or "") if state is HostState.RUNNING else ""
        return Seen(state, str(instance.get("status")), host, 0,
                    str(kind.get("gpu_description") or ""),
                    int((kind.get("specs") or {}).get("gpus") or 0))

    async def destroy(self, handle: Handle) -> bool:
        """``POST /api/v1/instance-operations/terminate`` for this one instance."""
        status, data = await self.api.call(
            "POST", "/api/v1/instance-operations/terminate",
            body={"instance_ids": [handle.instance_id]},
        )
        if status == 404 or error_code(data) == "global/object-does-not-exist":
            return False
        if status >= 400:
            raise BackendAPIError(f"lambda terminate {handle.instance_id}: HTTP {status}: "
                                  f"{message(data)}")
        return True

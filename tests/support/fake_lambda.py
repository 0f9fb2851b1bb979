"""A stand-in for Lambda Cloud's public REST API v1 (aiohttp on loopback), written from its
OpenAPI document "Lambda Cloud API" info.version 1.10.0 (the copy in
github.com/api-evangelist/lambda-labs, ``openapi/_original/lambda-labs-openapi.json``).

Operations (paths, bodies, ``{"data": ...}`` / ``{"error": {code, message, suggestion}}``
envelopes and status codes as specified):

- ``GET /api/v1/instance-types`` (listInstanceTypes): ``{"data": {name: InstanceTypesItem}}``
  with ``regions_with_capacity_available``.
- ``GET`` / ``POST /api/v1/ssh-keys`` (listSSHKeys, addSSHKey).
- ``POST /api/v1/instance-operations/launch`` (launchInstance): ``{"data": {"instance_ids":
  [...]}}``; 400 ``instance-operations/launch/insufficient-capacity`` or
  ``global/quota-exceeded``; 404 for an unknown type, region or key.
- ``GET /api/v1/instances[/{id}]`` (listInstances, getInstance): status ``booting`` → ``active``
  (with ``ip``) → after termination ``terminating`` → ``terminated``; 404
  ``global/object-does-not-exist`` for an unknown id.
- ``POST /api/v1/instance-operations/terminate`` (terminateInstance): ``{"data":
  {"terminated_instances": [...]}}``; 404 for an unknown or terminated instance.

Auth: ``Authorization: Bearer <key>`` (or Basic ``<key>:``), else 401
``global/invalid-api-key``. Rate limits as the document states them: one request per second,
and one launch per 12 seconds (both scaled for tests by ``request_interval`` and
``launch_interval``). The document names no status for exceeding them: this stand-in answers
429 with the error envelope (code ``global/too-many-requests``) and a ``Retry-After``.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from tests.support.fake_cloud import LoopbackHost

API_KEY = "secret_traind-test_0123456789abcdef"


def default_types() -> dict[str, dict[str, Any]]:
    """Instance types as listInstanceTypes returns them."""

    def kind(name: str, desc: str, gpu: str, cents: int, gpus: int, storage: int,
             regions: list[str]) -> dict[str, Any]:
        return {"instance_type": {
            "name": name, "description": desc, "gpu_description": gpu,
            "price_cents_per_hour": cents,
            "specs": {"vcpus": 30 * gpus, "memory_gib": 200 * gpus, "storage_gib": storage,
                      "gpus": gpus}},
            "regions_with_capacity_available": [
                {"name": r, "description": r.replace("-", " ")} for r in regions]}

    return {
        "gpu_1x_a10": kind("gpu_1x_a10", "1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75, 1, 1400,
                           ["us-east-1"]),
        "gpu_1x_h100_sxm5": kind("gpu_1x_h100_sxm5", "1x H100 (80 GB SXM5)",
                                 "H100 (80 GB SXM5)", 329, 1, 26000, ["us-south-1"]),
        "gpu_8x_a100": kind("gpu_8x_a100", "8x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 1032,
                            8, 6144, []),
    }


def error(status: int, code: str, message: str, suggestion: str | None = None) -> web.Response:
    """The error envelope."""
    body: dict[str, Any] = {"code": code, "message": message}
    if suggestion:
        body["suggestion"] = suggestion
    return web.json_response({"error": body}, status=status)


@dataclass
class Instance:
    """One instance as the stand-in tracks it."""

    id: str
    body: dict[str, Any]
    polls: int = 0
    terminated_polls: int | None = None


@dataclass
class FakeLambda:
    """The stand-in's state and failure switches (set them between requests)."""

    host: LoopbackHost = field(default_factory=LoopbackHost)
    types: dict[str, dict[str, Any]] = field(default_factory=default_types)
    api_key: str = API_KEY
    request_interval: float = 1.0
    launch_interval: float = 12.0
    booting_polls: int = 1
    never_active: bool = False
    refuse_launch: tuple[str, str] | None = None
    """Answer launches with 400 and this (code, message)."""
    ssh_keys: list[dict[str, str]] = field(default_factory=list)
    instances: dict[str, Instance] = field(default_factory=dict)
    terminated: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    throttled: list[str] = field(default_factory=list)
    """Paths answered 429."""
    _last_request: float = 0.0
    _last_launch: float = float("-inf")

    def app(self) -> web.Application:
        """The aiohttp application serving the operations above."""
        app = web.Application(middlewares=[self._gate])
        app.router.add_get("/api/v1/instance-types", self._types)
        app.router.add_get("/api/v1/ssh-keys", self._keys)
        app.router.add_post("/api/v1/ssh-keys", self._add_key)
        app.router.add_post("/api/v1/instance-operations/launch", self._launch)
        app.router.add_post("/api/v1/instance-operations/terminate", self._terminate)
        app.router.add_get("/api/v1/instances", self._list)
        app.router.add_get("/api/v1/instances/{id}", self._get)
        return app

    def _authorized(self, header: str) -> bool:
        basic = base64.b64encode(f"{self.api_key}:".encode()).decode()
        return header in (f"Bearer {self.api_key}", f"Basic {basic}")

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if not self._authorized(request.headers.get("Authorization", "")):
            return error(401, "global/invalid-api-key", "API key was invalid, expired, or "
                         "deleted.", "Check your API key or create a new one, then try again.")
        now = time.monotonic()
        launch = request.path.endswith("/instance-operations/launch")
        wait = max(self._last_request + self.request_interval - now,
                   self._last_launch + self.launch_interval - now if launch else 0.0)
        if wait > 0:
            self.throttled.append(request.path)
            response = error(429, "global/too-many-requests", "Too many requests.",
                             "Slow down and try again.")
            response.headers["Retry-After"] = f"{max(1, round(wait + 0.5))}"
            return response
        self._last_request = now
        if launch:
            self._last_launch = now
        answer: web.StreamResponse = await handler(request)
        return answer

    async def _types(self, request: web.Request) -> web.Response:
        return web.json_response({"data": self.types})

    async def _keys(self, request: web.Request) -> web.Response:
        return web.json_response({"data": self.ssh_keys})

    async def _add_key(self, request: web.Request) -> web.Response:
        body = await request.json()
        if any(k["name"] == body.get("name") for k in self.ssh_keys):
            return error(400, "global/invalid-parameters", "A key with that name exists.")
        key = {"id": uuid.uuid4().hex, "name": body["name"], "public_key": body["public_key"]}
        self.ssh_keys.append(key)
        return web.json_response({"data": key})

    async def _launch(self, request: web.Request) -> web.Response:
        body = await request.json()
        missing = [k for k in ("region_name", "instance_type_name", "ssh_key_names")
                   if k not in body]
        if missing or len(body.get("ssh_key_names") or []) != 1:
            return error(400, "global/invalid-parameters", "Invalid request data.",
                         "exactly one SSH key must be specified")
        if self.refuse_launch is not None:
            code, message = self.refuse_launch
            suggestion = ("Contact Support to increase your quota."
                          if code == "global/quota-exceeded" else None)
            return error(400, code, message, suggestion)
        kind = self.types.get(body["instance_type_name"])
        if kind is None or not any(k["name"] == body["ssh_key_names"][0] for k in self.ssh_keys):
            return error(404, "global/object-does-not-exist", "Instance type or SSH key not "
                         "found.", "Check the names and try again.")
        regions = [r["name"] for r in kind["regions_with_capacity_available"]]
        if body["region_name"] not in regions:
            return error(400, "instance-operations/launch/insufficient-capacity",
                         "Not enough capacity to fulfill launch request.")
        instance = Instance(uuid.uuid4().hex, body)
        self.instances[instance.id] = instance
        return web.json_response({"data": {"instance_ids": [instance.id]}})

    async def _terminate(self, request: web.Request) -> web.Response:
        ids = (await request.json()).get("instance_ids") or []
        found = [self.instances.get(i) for i in ids]
        if not ids or any(i is None or i.terminated_polls is not None for i in found):
            return error(404, "global/object-does-not-exist", "Specified instance does not "
                         "exist.")
        for instance in found:
            assert instance is not None
            instance.terminated_polls = 0
            self.terminated.append(instance.id)
        return web.json_response({"data": {"terminated_instances": [
            self._record(i) for i in found if i is not None]}})

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [self._record(i) for i in self.instances.values()
                                           if self._status(i) != "terminated"]})

    async def _get(self, request: web.Request) -> web.Response:
        instance = self.instances.get(request.match_info["id"])
        if instance is None:
            return error(404, "global/object-does-not-exist", "Specified instance does not "
                         "exist.")
        if instance.terminated_polls is not None:
            instance.terminated_polls += 1
        else:
            instance.polls += 1
        return web.json_response({"data": self._record(instance)})

    def live(self) -> list[str]:
        """Instances that are not terminated (still billed)."""
        return [i.id for i in self.instances.values() if self._status(i) != "terminated"]

    def ever_created(self) -> int:
        """How many instances were launched."""
        return len(self.instances)

    def _status(self, instance: Instance) -> str:
        if instance.terminated_polls is not None:
            return "terminating" if instance.terminated_polls < 1 else "terminated"
        if self.never_active or instance.polls <= self.booting_polls:
            return "booting"
        return "active"

    def _record(self, instance: Instance) -> dict[str, Any]:
        status = self._status(instance)
        body = instance.body
        kind = self.types[body["instance_type_name"]]["instance_type"]
        names = body["ssh_key_names"]
        if status == "active":
            for key in self.ssh_keys:
                if key["name"] in names:
                    self.host.install_key(key["public_key"])
        record: dict[str, Any] = {
            "id": instance.id, "name": body.get("name", ""), "status": status,
            "ssh_key_names": names, "file_system_names": [],
            "region": {"name": body["region_name"], "description": body["region_name"]},
            "instance_type": kind, "hostname": f"{instance.id[:8]}.cloud.lambda.ai",
            "actions": {},
        }
        if status == "active":
            record |= {"ip": self.host.host, "private_ip": "10.0.2.100"}
        return record

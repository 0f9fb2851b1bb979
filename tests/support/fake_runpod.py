"""A stand-in for RunPod's REST API v2 (aiohttp on loopback), written from the OpenAPI 3.1
document in RunPod's public docs repository: ``api-reference-v2/openapi.json`` (info.version
2.0.0; github.com/runpod/docs at a900806e, 2026-08-20).

Operations (paths, bodies, status codes and problem+json error bodies as specified):

- ``GET /v2/catalog/gpus`` (listGpuTypes): ``{"gpus": [GpuType]}``; with
  ``include=AVAILABILITY`` (which requires ``product``, else 400) each carries
  ``availability`` and the ``dataCenters`` with stock for ``count`` GPUs in ``cloud``.
- ``POST /v2/pods`` (createPod): 201 with the Pod in ``PROVISIONING``; 400 "no capacity"
  (the spec's capacity answer is a 400 with only a human ``detail``), 402 insufficient
  balance, 422 for a body that breaks the contract.
- ``GET /v2/pods/{id}`` (getPod): the Pod, ``PROVISIONING`` → ``STARTING`` → ``RUNNING`` over
  polls; once running its ``runtime.ports`` maps private ``22/tcp`` to a public port and
  ``ssh.direct`` is set; 404 when unknown.
- ``GET /v2/pods`` (listPods): ``{"pods": [Pod]}``.
- ``DELETE /v2/pods/{id}`` (deletePod): 204, after which the pod is gone (404).

Every request needs ``Authorization: Bearer <key>`` (401 otherwise). ``rate_limited`` answers
429 with ``Retry-After`` and the spec's ``rateLimited`` body. ``startSsh`` injects the
request's ``PUBLIC_KEY`` (the spec's convention); the stand-in installs it on the host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from tests.support.fake_cloud import LoopbackHost

API_KEY = "rpa_TESTKEY0123456789"


def default_gpus() -> list[dict[str, Any]]:
    """GPU types as listGpuTypes returns them, with stock per data center."""

    def gpu(gid: str, name: str, memory: int, secure: float, community: float,
            dcs: dict[str, str]) -> dict[str, Any]:
        return {
            "id": gid, "name": name, "pool": None, "manufacturer": "NVIDIA", "memory": memory,
            "secure": True, "community": True,
            "price": {"secure": secure, "community": community},
            "maxCount": {"secure": 8, "community": 4}, "dcs": dcs,
        }

    return [
        gpu("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.34,
            {"US-KS-2": "HIGH", "EU-RO-1": "LOW"}),
        gpu("NVIDIA GeForce RTX 3090", "RTX 3090", 24, 0.46, 0.22, {"US-TX-3": "NONE"}),
        gpu("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 2.69, 2.39, {"US-KS-2": "MEDIUM"}),
    ]


def problem(status: int, title: str, detail: str, **extra: Any) -> web.Response:
    """An ``application/problem+json`` ErrorResponse."""
    return web.json_response({"title": title, "status": status, "detail": detail} | extra,
                             status=status, content_type="application/problem+json")


@dataclass
class Pod:
    """One pod as the stand-in tracks it."""

    id: str
    body: dict[str, Any]
    data_center: str
    cost: float
    created_at: float = field(default_factory=time.time)
    polls: int = 0


@dataclass
class FakeRunPod:
    """The stand-in's state and failure switches (set them between requests)."""

    host: LoopbackHost = field(default_factory=LoopbackHost)
    gpus: list[dict[str, Any]] = field(default_factory=default_gpus)
    api_key: str = API_KEY
    polls_per_state: int = 1
    never_running: bool = False
    """Pods stay in STARTING."""
    refuse_create: tuple[int, str] | None = None
    """Answer creates with this status and detail (400 no capacity, 402 balance, ...)."""
    rate_limited: int = 0
    """Answer the next N requests with 429."""
    retry_after: int = 1
    pods: dict[str, Pod] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    throttled: list[str] = field(default_factory=list)
    """Paths answered 429."""
    _next: int = 1

    def app(self) -> web.Application:
        """The aiohttp application serving the operations above."""
        app = web.Application(middlewares=[self._gate])
        app.router.add_get("/v2/catalog/gpus", self._gpus)
        app.router.add_post("/v2/pods", self._create)
        app.router.add_get("/v2/pods", self._list)
        app.router.add_get("/v2/pods/{id}", self._get)
        app.router.add_delete("/v2/pods/{id}", self._delete)
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return problem(401, "Unauthorized", "invalid bearer token")
        if self.rate_limited > 0:
            self.rate_limited -= 1
            self.throttled.append(request.path)
            response = problem(429, "Too Many Requests",
                               "rate limit exceeded for the minute window")
            response.headers["Retry-After"] = str(self.retry_after)
            return response
        answer: web.StreamResponse = await handler(request)
        return answer

    async def _gpus(self, request: web.Request) -> web.Response:
        q = request.query
        if "AVAILABILITY" in q.get("include", "") and not q.get("product"):
            return problem(400, "Bad Request", "product is required with include=AVAILABILITY")
        cloud = q.get("cloud", "SECURE").lower()
        count = int(q.get("count", "1"))
        out = []
        for gpu in self.gpus:
            record = {k: v for k, v in gpu.items() if k != "dcs"}
            if "AVAILABILITY" in q.get("include", ""):
                fits = count <= gpu["maxCount"][cloud]
                dcs = [{"id": dc, "name": dc, "availability": level if fits else "NONE"}
                       for dc, level in gpu["dcs"].items()]
                record["availability"] = max((d["availability"] for d in dcs), default="NONE",
                                             key=["NONE", "LOW", "MEDIUM", "HIGH"].index)
                record["dataCenters"] = [d for d in dcs if d["availability"] != "NONE"]
            out.append(record)
        return web.json_response({"gpus": out})

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        missing = [k for k in ("name", "image") if not body.get(k)]
        if missing or "gpu" not in body:
            return problem(422, "Unprocessable Entity", "Request validation failed.",
                           errors=[f"$: missing property '{k}'" for k in missing or ["gpu"]])
        if self.refuse_create is not None:
            status, detail = self.refuse_create
            return problem(status, {400: "Bad Request", 402: "Payment Required"}.get(
                status, "Error"), detail)
        gpu = next((g for g in self.gpus if g["id"] == body["gpu"]["id"]), None)
        if gpu is None:
            return problem(400, "Bad Request", f"unknown gpu type {body['gpu']['id']}")
        cloud = str(body.get("cloud", "SECURE")).lower()
        dc = (body.get("dataCenterIds") or list(gpu["dcs"]))[0]
        pod = Pod(f"pod{self._next:06d}", body, dc,
                  gpu["price"][cloud] * int(body["gpu"].get("count", 1)))
        self._next += 1
        self.pods[pod.id] = pod
        return web.json_response(self._record(pod), status=201)

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response({"pods": [self._record(p) for p in self.pods.values()]})

    async def _get(self, request: web.Request) -> web.Response:
        pod = self.pods.get(request.match_info["id"])
        if pod is None:
            return problem(404, "Not Found", "pod not found")
        pod.polls += 1
        return web.json_response(self._record(pod))

    async def _delete(self, request: web.Request) -> web.Response:
        pod = self.pods.pop(request.match_info["id"], None)
        if pod is None:
            return problem(404, "Not Found", "pod not found")
        self.deleted.append(pod.id)
        return web.Response(status=204)

    def live(self) -> list[str]:
        """Pods that exist (billed)."""
        return list(self.pods)

    def ever_created(self) -> int:
        """How many pods were created."""
        return len(self.pods) + len(self.deleted)

    def _status(self, pod: Pod) -> str:
        if pod.polls <= self.polls_per_state:
            return "PROVISIONING"
        if self.never_running or pod.polls <= 2 * self.polls_per_state:
            return "STARTING"
        return "RUNNING"

    def _record(self, pod: Pod) -> dict[str, Any]:
        status = self._status(pod)
        running = status == "RUNNING"
        body = pod.body
        if running and body.get("startSsh"):
            self.host.install_key(str((body.get("env") or {}).get("PUBLIC_KEY", "")))
        ssh_tcp = any(p == "22/tcp" for p in body.get("ports") or [])
        direct = ({"host": self.host.host, "port": self.host.port, "username": "root",
                   "command": f"ssh root@{self.host.host} -p {self.host.port}"}
                  if running and ssh_tcp else None)
        return {
            "id": pod.id, "name": body["name"], "image": body["image"], "args": "",
            "disk": body.get("disk", 50), "ports": body.get("ports") or [],
            "env": {k: v for k, v in (body.get("env") or {}).items() if k != "PUBLIC_KEY"},
            "registry": None, "status": status,
            "actions": ["stop", "restart", "terminate"] if running else ["stop", "terminate"],
            "mounts": {}, "gpu": {"id": body["gpu"]["id"], "count": body["gpu"].get("count", 1)},
            "cloud": body.get("cloud", "SECURE"), "dataCenterId": pod.data_center,
            "cudaVersion": "12.8",
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22,
                              "username": f"{pod.id}-64411eb2",
                              "command": f"ssh {pod.id}-64411eb2@ssh.runpod.io"},
                    "direct": direct},
            "template": None, "cost": pod.cost, "locked": False,
            "globalNetworking": {"enabled": False},
            "runtime": {"uptime": int(time.time() - pod.created_at),
                        "ports": [{"private": 22, "public": self.host.port, "type": "tcp",
                                   "ip": self.host.host}] if ssh_tcp else []}
            if running else None,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pod.created_at)),
            "startedAt": None,
        }

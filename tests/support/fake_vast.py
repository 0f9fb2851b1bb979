"""A stand-in for vast.ai's REST API (aiohttp on loopback), written from its documented
endpoints, with failures that can be switched on.

Endpoints (paths, methods and JSON shapes as in vast.ai's API reference; values made up):

- ``GET  /api/v0/bundles/?q=<json>`` → ``{"offers": [...]}``: the ``q`` filters
  (``eq``/``gte``/``lte``/``in`` per field) and ``order``/``limit`` are applied.
- ``PUT  /api/v0/asks/{offer}/`` → ``{"success": true, "new_contract": <instance id>}``.
- ``POST /api/v0/instances/{id}/ssh/`` → ``{"success": true, "msg": ...}``.
- ``GET  /api/v0/instances/`` → ``{"instances": [...]}``; ``GET /api/v0/instances/{id}/`` →
  ``{"instances": {...}}`` with ``actual_status`` "loading" for ``loading_polls`` polls, then
  "running" with ``ssh_host``/``ssh_port``.
- ``DELETE /api/v0/instances/{id}/`` → ``{"success": true}``.

Not documented, so chosen here: an unknown instance answers HTTP 404 with
``{"success": false, "error": "no_such_instance"}``; a refused create answers HTTP 400 with
``{"success": false, "error": ..., "msg": ...}``. Every request must carry
``Authorization: Bearer <api_key>`` (else 401).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

API_KEY = "vast-test-key-7f3a9c"


def default_offers() -> list[dict[str, Any]]:
    """Varied offers: models, counts, prices, reliability, bandwidth, disk, duration, flags."""
    day = 86400.0

    def offer(i: int, gpu: str, n: int, price: float, **kw: Any) -> dict[str, Any]:
        return {
            "id": i, "ask_contract_id": i, "machine_id": 1000 + i, "gpu_name": gpu,
            "num_gpus": n, "gpu_ram": kw.get("gpu_ram", 24564), "dph_total": price,
            "disk_space": kw.get("disk", 200.0), "inet_down": kw.get("down", 800.0),
            "inet_up": 400.0, "reliability2": kw.get("rel", 0.99),
            "duration": kw.get("duration", 30 * day), "geolocation": kw.get("geo", "US"),
            "verified": kw.get("verified", True), "rentable": kw.get("rentable", True),
            "rented": False, "cuda_max_good": 12.4,
        }

    return [
        offer(101, "RTX 4090", 1, 0.42, rel=0.995, down=900),
        offer(102, "RTX 4090", 1, 0.35, rel=0.90, down=500),      # cheap but unreliable
        offer(103, "RTX 4090", 2, 0.80, rel=0.99),
        offer(104, "RTX 4090", 1, 0.39, rel=0.98, disk=20.0),     # too little disk
        offer(105, "RTX 4090", 1, 0.40, rel=0.99, duration=2 * 3600),  # only 2 hours
        offer(106, "RTX 3090", 1, 0.20, rel=0.999, gpu_ram=24576),
        offer(107, "H100 SXM", 1, 2.10, rel=0.999, gpu_ram=81559, down=5000),
        offer(108, "RTX 4090", 1, 0.42, rel=0.97, down=300),      # ties 101 on price
        offer(109, "RTX 4090", 1, 0.30, rentable=False),          # not rentable
        offer(110, "RTX 4090", 1, 0.41, rel=0.99, down=50),       # slow download
    ]


@dataclass
class Instance:
    """One rented instance as the stand-in tracks it."""

    id: int
    offer: dict[str, Any]
    body: dict[str, Any]
    created_at: float = field(default_factory=time.time)
    polls: int = 0
    ssh_keys: list[str] = field(default_factory=list)


@dataclass
class FakeVast:
    """The stand-in server's state and its failure switches (set them between requests)."""

    offers: list[dict[str, Any]] = field(default_factory=default_offers)
    ssh_host: str = "127.0.0.1"
    ssh_port: int = 22
    loading_polls: int = 2
    api_key: str = API_KEY
    url: str = ""
    """The base URL while served by RunningFakeVast."""
    refuse_create: str | None = None
    """Answer creates with HTTP 400 and this message."""
    create_then_fail: bool = False
    """Create the instance, then answer HTTP 500 (the answer is lost)."""
    vanish_after_polls: int | None = None
    """Forget an instance after this many shows (host died, instance gone)."""
    stuck_loading: bool = False
    server_errors: Counter[str] = field(default_factory=Counter)
    """Answer the next N requests of a method (e.g. ``{"GET": 2}``) with HTTP 503."""
    instances: dict[int, Instance] = field(default_factory=dict)
    destroyed: list[int] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)
    _next_id: int = 5000

    def app(self) -> web.Application:
        """The aiohttp application serving the endpoints above."""
        app = web.Application(middlewares=[self._gate])
        app.router.add_get("/api/v0/bundles/", self._search)
        app.router.add_put("/api/v0/asks/{id}/", self._create)
        app.router.add_post("/api/v0/instances/{id}/ssh/", self._attach_ssh)
        app.router.add_get("/api/v0/instances/", self._list)
        app.router.add_get("/api/v0/instances/{id}/", self._show)
        app.router.add_delete("/api/v0/instances/{id}/", self._destroy)
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"success": False, "error": "auth_error"}, status=401)
        if self.server_errors[request.method] > 0:
            self.server_errors[request.method] -= 1
            return web.json_response({"success": False, "error": "unavailable"}, status=503)
        response: web.StreamResponse = await handler(request)
        return response

    async def _search(self, request: web.Request) -> web.Response:
        q = json.loads(request.query.get("q", "{}"))
        self.queries.append(q)
        found = [o for o in self.offers if _matches(o, q)]
        for key, direction in reversed(q.get("order", [])):
            found.sort(key=lambda o, k=key: o.get(k, 0), reverse=direction == "desc")
        return web.json_response({"offers": found[: int(q.get("limit", 64))]})

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse_create is not None:
            return web.json_response(
                {"success": False, "error": "invalid_args", "msg": self.refuse_create}, status=400
            )
        offer = next((o for o in self.offers if str(o["id"]) == request.match_info["id"]), None)
        if offer is None:
            return web.json_response(
                {"success": False, "error": "no_such_ask", "msg": "offer is gone"}, status=404
            )
        self._next_id += 1
        self.instances[self._next_id] = Instance(self._next_id, offer, body)
        if self.create_then_fail:
            return web.json_response({"success": False, "error": "server_error"}, status=500)
        return web.json_response({"success": True, "new_contract": self._next_id})

    async def _attach_ssh(self, request: web.Request) -> web.Response:
        instance = self.instances.get(int(request.match_info["id"]))
        if instance is None:
            return _missing()
        instance.ssh_keys.append((await request.json())["ssh_key"])
        return web.json_response({"success": True, "msg": "SSH key attached successfully"})

    async def _list(self, request: web.Request) -> web.Response:
        return web.json_response({"instances": [self._record(i) for i in self.instances.values()]})

    async def _show(self, request: web.Request) -> web.Response:
        instance = self.instances.get(int(request.match_info["id"]))
        if instance is None:
            return _missing()
        instance.polls += 1
        if self.vanish_after_polls is not None and instance.polls > self.vanish_after_polls:
            del self.instances[instance.id]
            return _missing()
        return web.json_response({"instances": self._record(instance)})

    async def _destroy(self, request: web.Request) -> web.Response:
        instance = self.instances.pop(int(request.match_info["id"]), None)
        if instance is None:
            return _missing()
        self.destroyed.append(instance.id)
        return web.json_response({"success": True})

    def _record(self, instance: Instance) -> dict[str, Any]:
        running = not self.stuck_loading and instance.polls > self.loading_polls
        offer = instance.offer
        return {
            "id": instance.id, "label": instance.body.get("label"),
            "actual_status": "running" if running else "loading",
            "intended_status": "running", "cur_state": "running", "next_state": "running",
            "status_msg": "success, running" if running else "Pulling image",
            "image_uuid": instance.body.get("image"), "disk_space": instance.body.get("disk"),
            "gpu_name": offer["gpu_name"], "num_gpus": offer["num_gpus"],
            "dph_total": offer["dph_total"], "start_date": instance.created_at,
            "uptime_mins": (time.time() - instance.created_at) / 60,
            "ssh_host": self.ssh_host if running else None,
            "ssh_port": self.ssh_port if running else None,
            "public_ipaddr": self.ssh_host,
        }


def _missing() -> web.Response:
    return web.json_response(
        {"success": False, "error": "no_such_instance", "msg": "Instance not found"}, status=404
    )


def _matches(offer: dict[str, Any], q: dict[str, Any]) -> bool:
    for name, cond in q.items():
        if not isinstance(cond, dict) or name not in offer:
            continue
        value = offer[name]
        for op, want in cond.items():
            ok = {
                "eq": lambda v, w: v == w, "neq": lambda v, w: v != w,
                "gte": lambda v, w: v >= w, "lte": lambda v, w: v <= w,
                "gt": lambda v, w: v > w, "lt": lambda v, w: v < w,
                "in": lambda v, w: v in w, "notin": lambda v, w: v not in w,
            }[op](value, want)
            if not ok:
                return False
    return True


class RunningFakeVast:
    """``async with RunningFakeVast(fake) as url:`` serves ``fake`` on a free loopback port."""

    def __init__(self, fake: FakeVast) -> None:
        self.fake = fake
        self._runner = web.AppRunner(fake.app(), access_log=None)

    async def __aenter__(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.fake.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.fake.url

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

"""The status server: ``/healthz``, ``/status`` (JSON) and ``/metrics`` (Prometheus).

It listens on loopback by default, or on a unix socket (``unix:/run/traind/status.sock``);
it serves what the daemon hands it and holds no state of its own.
"""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import structlog
from aiohttp import web

from traind.errors import TraindError
from traind.status.address import TCPAddress, UnixAddress, parse_listen
from traind.status.metrics import CONTENT_TYPE, Metrics

log = structlog.get_logger("traind.status")

Snapshot = Callable[[], Mapping[str, Any]]


class StatusServer:
    """Serves the daemon's snapshot and metrics; ``async with`` it, or ``start``/``stop``."""

    def __init__(self, listen: str, snapshot: Snapshot, metrics: Metrics) -> None:
        self.address = parse_listen(listen)
        self._snapshot = snapshot
        self._metrics = metrics
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind and serve; TraindError if the address cannot be used."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics_page)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site: web.BaseSite
        if isinstance(self.address, UnixAddress):
            self.address.path.parent.mkdir(parents=True, exist_ok=True)
            site = web.UnixSite(runner, self.address.path)
        else:
            site = web.TCPSite(runner, self.address.host, self.address.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            if exc.errno == errno.EADDRINUSE:
                raise TraindError(
                    f"status.listen {self.address} is already in use (another traind?)"
                ) from exc
            raise TraindError(f"status server cannot listen on {self.address}: {exc}") from exc
        self._runner = runner
        if isinstance(self.address, TCPAddress) and self.address.port == 0:
            host, port = runner.addresses[0][:2]
            self.address = TCPAddress(host, port)
        log.info("status_server_started", listen=str(self.address))

    async def stop(self) -> None:
        """Stop serving and free the address."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        await runner.cleanup()
        if isinstance(self.address, UnixAddress):
            with contextlib.suppress(FileNotFoundError):
                self.address.path.unlink()
        log.info("status_server_stopped", listen=str(self.address))

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _status(self, request: web.Request) -> web.Response:
        try:
            body = json.dumps(self._snapshot())
        except Exception as exc:  # a broken snapshot is a 500, never a dead server
            log.error("status_snapshot_failed", error=repr(exc))
            return web.json_response({"error": repr(exc)}, status=500)
        return web.Response(text=body, content_type="application/json")

    async def _metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

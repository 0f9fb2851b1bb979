"""The status server: ``/`` (the status page), ``/healthz``, ``/status`` (JSON) and
``/metrics`` (Prometheus).

It listens on loopback by default, or on a unix socket (``unix:/run/traind/status.sock``);
it serves what the daemon hands it and holds no state of its own. Everything it serves is
read-only: the page has no actions, so it needs no protection the JSON does not have.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
from collections.abc import Callable, Mapping
from importlib import resources
from types import TracebackType
from typing import Any, cast

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from traind.errors import TraindError
from traind.status.metrics import CONTENT_TYPE, Metrics
from traind.status.model import StatusSnapshot
from traind.status.view import main_html, page_html
from traind.util.address import TCPAddress, UnixAddress, parse_listen
from traind.util.jsontext import strict_json

log = structlog.get_logger("traind.status")

Snapshot = Callable[[], Mapping[str, Any]]

IDLE_TIMEOUT = 15.0
"""Seconds a connection may stay open without a whole request (aiohttp's keep-alive timer,
which also runs from the connection's start): an idle or slow client is let go well before
an hour's worth of them could hold the daemon's file descriptors."""

ASSETS = {"app.js": "text/javascript", "style.css": "text/css", "icon.svg": "image/svg+xml"}
"""The status page's files in ``traind/status/page/``, and their content types."""

PAGE_HEADERS = {
    # Only traind's own files run or style the page; it cannot be framed or post anywhere.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _assets() -> dict[str, tuple[bytes, str]]:
    """Each page file's bytes and its ETag, read once from the installed package."""
    folder = resources.files("traind.status") / "page"
    found = {}
    for name in ASSETS:
        body = (folder / name).read_bytes()
        found[name] = (body, '"' + hashlib.sha256(body).hexdigest()[:16] + '"')
    return found


class _RequestLog(logging.Logger):
    """aiohttp's server logger (``RequestHandler(logger=...)``): what aiohttp reports there
    becomes one structlog event. A request aiohttp refused before any handler ran (a bad
    request line or method, a header past its limits, bytes that are not HTTP) was answered
    4xx already: one ``status_request_refused`` line, without aiohttp's traceback."""

    def __init__(self) -> None:
        super().__init__("traind.status.requests")

    def handle(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if isinstance(exc, HttpProcessingError):
            said = " ".join(str(exc.message).split())  # a multi-line message in one line
            # aiohttp says debug for non-HTTP bytes (TLS, a scanner) as a connection's first
            (log.debug if record.levelno < logging.INFO else log.info)(
                "status_request_refused", remote=remote, status=exc.code, reason=said[:200])
        else:
            log.error("status_request_failed", remote=remote, message=record.getMessage(),
                      exc_info=record.exc_info)


class StatusServer:
    """Serves the daemon's snapshot and metrics; ``async with`` it, or ``start``/``stop``."""

    def __init__(self, listen: str, snapshot: Snapshot, metrics: Metrics) -> None:
        self.address = parse_listen(listen)
        self._snapshot = snapshot
        self._metrics = metrics
        self._runner: web.AppRunner | None = None
        self._assets = _assets()

    async def start(self) -> None:
        """Bind and serve; TraindError if the address cannot be used."""
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/page/{name}", self._asset)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics_page)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0,
                               logger=_RequestLog(), keepalive_timeout=IDLE_TIMEOUT)
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
            body = strict_json(self._snapshot())
        except Exception as exc:  # a broken snapshot is a 500, never a dead server
            log.error("status_snapshot_failed", error=repr(exc))
            return web.json_response({"error": repr(exc)}, status=500)
        return web.Response(text=body, content_type="application/json")

    async def _metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _page(self, request: web.Request) -> web.Response:
        """The status page; ``?part=main`` is its content alone (what the page's script
        fetches to update itself)."""
        try:
            status = cast(StatusSnapshot, self._snapshot())
            html = main_html(status) if request.query.get("part") == "main" else page_html(status)
        except Exception as exc:  # a broken snapshot is a 500, never a dead server
            log.error("status_snapshot_failed", error=repr(exc))
            return web.Response(text=f"traind: the status is unavailable: {exc!r}", status=500)
        response = web.Response(text=html, content_type="text/html", headers=PAGE_HEADERS)
        response.enable_compression()
        return response

    async def _asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self._assets:
            raise web.HTTPNotFound()
        body, etag = self._assets[name]
        headers = {**PAGE_HEADERS, "ETag": etag}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        response = web.Response(body=body, content_type=ASSETS[name], headers=headers)
        response.enable_compression()
        return response

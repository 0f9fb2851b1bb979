"""A real HTTP proxy in front of SeaweedFS that answers S3 listings with 503 SlowDown, as a
throttled AWS S3 does when every host of a large job lists one prefix at once.

Every other request is forwarded as it came (the Host header kept, so SigV4 signatures made
for the proxy's address still match), and so is a listing once ``throttle`` runs out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


@dataclass
class ThrottlingProxy:
    """Forwards to ``upstream``; the next ``throttle`` listings get 503 SlowDown."""

    upstream: str
    throttle: int = 0
    """Listings still to refuse; a negative count refuses every listing."""
    throttled: int = 0
    """Listings refused so far (the fault really happened)."""
    listings: int = 0
    """Listings seen, refused or forwarded."""
    endpoint: str = ""
    requests: list[str] = field(default_factory=list)
    """Every request seen, as ``METHOD key?query-names`` (what the store was asked)."""
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    async def _handle(self, request: web.Request) -> web.Response:
        query = "&".join(sorted(request.query))
        self.requests.append(f"{request.method} {request.path}" + (f"?{query}" if query else ""))
        if request.method == "GET" and "list-type" in request.query:
            self.listings += 1
            if self.throttle != 0:
                self.throttle -= 1 if self.throttle > 0 else 0
                self.throttled += 1
                return web.Response(status=503, body=SLOW_DOWN,
                                    content_type="application/xml")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers,
            data=await request.read(), allow_redirects=False,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept", "Accept-Encoding"),
        ) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
            return web.Response(status=resp.status, headers=out, body=body)


@asynccontextmanager
async def throttling_proxy(upstream: str) -> AsyncIterator[ThrottlingProxy]:
    """Serve a ThrottlingProxy for ``upstream`` on a free loopback port for the block."""
    proxy = ThrottlingProxy(upstream)
    app = web.Application(client_max_size=1024 ** 3)
    app.router.add_route("*", "/{tail:.*}", proxy._handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            proxy._session = session
            await site.start()
            port = runner.addresses[0][1]
            proxy.endpoint = f"http://127.0.0.1:{port}"
            yield proxy
    finally:
        await runner.cleanup()

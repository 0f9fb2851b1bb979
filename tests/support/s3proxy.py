"""A real HTTP proxy in front of SeaweedFS that answers S3 listings with 503 SlowDown, as a
throttled AWS S3 does when every host of a large job lists one prefix at once, and can drop
the conditions (``If-None-Match``, ``If-Match``) from puts, as a store that ignores them does.

Every other request is forwarded as it came (the Host header kept, so SigV4 signatures made
for the proxy's address still match), and so is a listing once ``throttle`` runs out. A put
whose conditions are dropped is signed again with the test credentials: they are signed
headers, so the client's signature no longer matches without them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from tests.support.net import forwarding
from tests.support.seaweed import ACCESS_KEY, REGION, SECRET_KEY

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}
_CONDITIONS = {"if-none-match", "if-match"}


class _Resigner(S3SigV4Auth):  # type: ignore[misc]  # botocore has no types
    """SigV4 for S3 with the payload hash the client sent (``UNSIGNED-PAYLOAD``, a sha256 or
    a streaming marker), so the body is forwarded as it came."""

    def __init__(self, payload_hash: str) -> None:
        super().__init__(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)
        self._payload_hash = payload_hash

    def payload(self, request: AWSRequest) -> str:
        return self._payload_hash


def without_conditions(method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` without ``If-None-Match``/``If-Match``, signed again for ``url`` (as the
    store sees it: the client's Host, path and query) with the test credentials."""
    kept = {k: v for k, v in headers.items()
            if k.lower() not in _CONDITIONS | {"authorization", "x-amz-date"}}
    request = AWSRequest(method=method, url=url, headers=kept)
    payload = next((v for k, v in headers.items() if k.lower() == "x-amz-content-sha256"),
                   "UNSIGNED-PAYLOAD")
    _Resigner(payload).add_auth(request)
    return dict(request.headers.items())


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
    ignore_conditions: bool = False
    """Drop ``If-None-Match``/``If-Match`` from every PUT, as a store that ignores them."""
    dropped: int = 0
    """PUTs whose conditions were dropped (the store really did not see them)."""
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
        if self.ignore_conditions and request.method == "PUT" and any(
                k.lower() in _CONDITIONS for k in headers):
            headers = without_conditions(
                request.method, f"http://{request.host}{request.raw_path}", headers)
            self.dropped += 1
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers,
            data=await request.read(), allow_redirects=False,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept", "Accept-Encoding"),
        ) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
            if request.method == "HEAD" and "Content-Length" in resp.headers:
                out["Content-Length"] = resp.headers["Content-Length"]  # of what a GET sends
                return web.Response(status=resp.status, headers=out)
            return web.Response(status=resp.status, headers=out, body=body)


@asynccontextmanager
async def throttling_proxy(upstream: str, ignore_conditions: bool = False
                           ) -> AsyncIterator[ThrottlingProxy]:
    """Serve a ThrottlingProxy for ``upstream`` on a free loopback port for the block
    (dropping the conditions of puts with ``ignore_conditions``)."""
    proxy = ThrottlingProxy(upstream, ignore_conditions=ignore_conditions)
    async with forwarding(proxy._handle) as (endpoint, session):
        proxy._session, proxy.endpoint = session, endpoint
        yield proxy

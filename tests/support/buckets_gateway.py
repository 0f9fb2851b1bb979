"""Hugging Face Storage Buckets' S3 gateway (``https://s3.hf.co/<namespace>``), reproduced in
front of SeaweedFS from the gateway's published rules (hub-docs ``storage-buckets-s3.md``).

What it enforces: requests come path-addressed under ``/<namespace>/<bucket>/``; a body sent
with aws-chunked checksum trailers is refused; ``x-amz-meta-*`` is not stored (dropped from
puts, never answered); a listing is ListObjectsV2 with no delimiter but ``/``; UploadPartCopy
is not implemented; a GetObject from a user agent other than botocore's or aws-cli's is
answered with a 302 to a CDN (served here under ``/cdn/``). ``If-None-Match``/``If-Match`` on
PutObject reach SeaweedFS, which honours them. Requests are signed again for SeaweedFS after
the namespace is taken off the path (with the test credentials, as the gateway checks its own).
"""

from __future__ import annotations

import re
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

NAMESPACE = "traind-org"
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}
_BOTOCORE = re.compile(r"botocore|aws-cli", re.IGNORECASE)


def _error(status: int, code: str, message: str) -> web.Response:
    body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()
    return web.Response(status=status, body=body, content_type="application/xml")


class _Signer(S3SigV4Auth):  # type: ignore[misc]  # botocore has no types
    def __init__(self, payload_hash: str) -> None:
        super().__init__(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)
        self._payload_hash = payload_hash

    def payload(self, request: AWSRequest) -> str:
        return self._payload_hash


@dataclass
class BucketsGateway:
    """Forwards to ``upstream`` what the gateway accepts; counts what it refused."""

    upstream: str
    endpoint: str = ""
    """The gateway's URL with the namespace: the ``endpoint_url`` a config names."""
    refused: list[str] = field(default_factory=list)
    """What was refused or changed, by rule (``trailer``, ``metadata``, ``redirect``, …)."""
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.path.startswith("/cdn/"):  # the CDN a redirected GET lands on
            return await self._forward(request, request.path.removeprefix("/cdn"), cdn=True)
        prefix = f"/{NAMESPACE}/"
        if not request.path.startswith(prefix):
            return _error(404, "NoSuchBucket", "not a bucket of this namespace")
        path = "/" + request.path[len(prefix):]
        headers = {k.lower(): v for k, v in request.headers.items()}
        if "aws-chunked" in headers.get("content-encoding", "") or "x-amz-trailer" in headers \
                or "TRAILER" in headers.get("x-amz-content-sha256", ""):
            self.refused.append("trailer")
            return _error(400, "InvalidRequest", "aws-chunked checksum trailers are not "
                                                 "supported; set checksums to when_required")
        if request.method == "PUT" and "x-amz-copy-source" in headers and (
                "partNumber" in request.query):
            self.refused.append("upload-part-copy")
            return _error(501, "NotImplemented", "UploadPartCopy is not supported")
        if request.method == "GET" and path.count("/") == 1 and (
                "list-type" in request.query or not request.query):
            if request.query.get("list-type") != "2" or request.query.get(
                    "delimiter", "/") != "/":
                self.refused.append("listing")
                return _error(400, "InvalidArgument", "only ListObjectsV2 with delimiter /")
        elif request.method == "GET" and path.count("/") >= 2 and not _BOTOCORE.search(
                headers.get("user-agent", "")):
            self.refused.append("redirect")
            raise web.HTTPFound(f"{self.endpoint.rsplit('/', 1)[0]}/cdn{path}")
        return await self._forward(request, path)

    async def _forward(self, request: web.Request, path: str,
                       cdn: bool = False) -> web.StreamResponse:
        assert self._session is not None
        query = request.raw_path.partition("?")[2]
        kept = {k: v for k, v in request.headers.items() if k.lower() not in _HOP | {
            "authorization", "x-amz-date", "x-amz-security-token"}
            and not k.lower().startswith("x-amz-meta-")}
        if any(k.lower().startswith("x-amz-meta-") for k in request.headers):
            self.refused.append("metadata")
        url = f"http://{request.host}{path}" + (f"?{query}" if query else "")
        signed = AWSRequest(method=request.method, url=url, headers=kept)
        _Signer(kept.get("X-Amz-Content-SHA256", kept.get("x-amz-content-sha256",
                                                           "UNSIGNED-PAYLOAD"))).add_auth(signed)
        async with self._session.request(
            request.method, self.upstream + path + (f"?{query}" if query else ""),
            headers=dict(signed.headers.items()), data=await request.read(),
            allow_redirects=False,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept", "Accept-Encoding"),
        ) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP
                   and not k.lower().startswith("x-amz-meta-")}
            if request.method == "HEAD" and "Content-Length" in resp.headers:
                out["Content-Length"] = resp.headers["Content-Length"]
                return web.Response(status=resp.status, headers=out)
            return web.Response(status=resp.status, headers=out, body=body)


@asynccontextmanager
async def buckets_gateway(upstream: str) -> AsyncIterator[BucketsGateway]:
    """Serve the gateway for ``upstream`` (SeaweedFS) on a free loopback port."""
    gateway = BucketsGateway(upstream)
    async with forwarding(gateway._handle) as (endpoint, session):
        gateway._session, gateway.endpoint = session, f"{endpoint}/{NAMESPACE}"
        yield gateway

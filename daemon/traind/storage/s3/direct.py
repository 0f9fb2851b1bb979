"""S3 requests with large bodies, sent and received directly (the transfer fast path).

Part uploads and ranged GETs are where every byte goes, and the general machinery costs
there: per request, aiobotocore builds, serialises and parses through its whole pipeline,
and aiohttp hands a response body over as many small ``bytes``. Here a request is signed
with the client's own SigV4 signer (its credentials, region and payload-signing setting;
~0.1 ms), written by hand on a kept-alive ``s3_http.Connection``, and its body sent from,
or received into, reusable buffers. Measured on the 4 GiB checkpoint of bench/s3_upload.py
(SeaweedFS on the same 2 cores, in the same runs, ``TRAIND_S3_DIRECT=0`` for the other path):
uploads 1.36-1.46 client CPU s/GB against 1.41-1.61 through aiobotocore; restores 876-899
MB/s at 0.92-0.94 s/GB against 778-789 MB/s at 1.12-1.14 (both writing with direct I/O).

The client still resolves each key's URL (addressing style, endpoint rules): it presigns
a GET once per key, and requests go to that URL's scheme, host and path.

Scope: direct plain-HTTP or TLS connections with credentials. When a proxy is configured in
the environment, the endpoint is not http(s), the client uses a client certificate, has no
credentials, or ``TRAIND_S3_DIRECT=0`` is set, ``direct_client`` returns None and transfers
go through aiobotocore.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from urllib.parse import quote, urlsplit

from botocore import exceptions as bce
from botocore.awsrequest import AWSRequest
from botocore.httpsession import get_cert_path

from traind.storage.s3.client import Ops
from traind.storage.s3.http import Connection, Response, client_error

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
_OFF = {"0", "false", "no", "off"}


def direct_client(ops: Ops, connect_timeout: float) -> Direct | None:
    """A Direct client for ``ops``' endpoint, or None where aiobotocore must be used."""
    if os.environ.get("TRAIND_S3_DIRECT", "").strip().lower() in _OFF:
        return None
    if any(os.environ.get(name) for name in _PROXY_VARS):
        return None
    client = ops.client
    url = urlsplit(str(client.meta.endpoint_url))
    if url.scheme not in {"http", "https"} or not url.hostname:
        return None
    signer = getattr(client, "_request_signer", None)
    if getattr(signer, "_credentials", None) is None:
        return None  # anonymous access: nothing to sign with
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    if getattr(session, "_cert_file", None):
        return None
    ctx: ssl.SSLContext | None = None
    if url.scheme == "https":
        verify = getattr(session, "_verify", True)
        if verify is False:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=get_cert_path(verify))
    return Direct(ops, ctx, connect_timeout)


class Direct:
    """Signed GETs and PUTs over kept-alive connections to one endpoint."""

    def __init__(
        self, ops: Ops, ssl_context: ssl.SSLContext | None, connect_timeout: float
    ) -> None:
        self.ops = ops
        self._connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._idle: list[Connection] = []
        self._urls: dict[str, str] = {}

    def close(self) -> None:
        """Close the idle connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def get(self, key: str, start: int, end: int, into: memoryview) -> Body:
        """Send ``GET key`` for bytes ``start`` to ``end - 1``, to be received ``into`` a
        buffer of ``end - start`` bytes; return the response's body (``Body.filled``).

        Raises botocore's ClientError for an S3 error response, connection and timeout
        errors as they are: ``s3_errors.retrying`` sorts and translates all of them.
        """
        headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        conn, response = await self._send("GET", key, {}, headers, None, "GetObject", into)
        return Body(self, conn, response)

    async def put(
        self, key: str, body: memoryview, query: dict[str, str], headers: dict[str, str],
        operation: str,
    ) -> Response:
        """``PUT`` ``body`` at ``key`` (``query``: e.g. a part's number and upload id);
        return the response's head. Errors as for ``get``."""
        headers = {**headers, "Content-Length": str(len(body))}
        conn, response = await self._send("PUT", key, query, headers, body, operation)
        self._give_back(conn)  # reused if the (empty) response body has been read
        return response

    async def _send(
        self, method: str, key: str, query: dict[str, str], headers: dict[str, str],
        body: memoryview | None, operation: str, sink: memoryview | None = None,
    ) -> tuple[Connection, Response]:
        url = urlsplit(await self._url(key))
        target = url.path
        if query:
            target += "?" + "&".join(f"{quote(k, '')}={quote(v, '')}"
                                     for k, v in sorted(query.items()))
        request = AWSRequest(method=method, url=f"{url.scheme}://{url.netloc}{target}",
                             headers={"Host": url.netloc, **headers})
        await self._sign(request)
        head = "".join([f"{method} {target} HTTP/1.1\r\n", "User-Agent: traind\r\n",
                        *(f"{k}: {v}\r\n" for k, v in request.headers.items()), "\r\n"])
        conn = await self._connection(url.scheme, url.hostname or "", url.port)
        idle = self.ops.read_timeout
        try:
            response = await conn.request(head.encode("latin-1"), body, idle, sink)
            if response.status not in {200, 206}:
                raise await client_error(conn, response, idle, operation)
        except BaseException:
            conn.close()
            raise
        return conn, response

    async def _sign(self, request: AWSRequest) -> None:
        """Add SigV4 headers as the client would: its (refreshed) credentials and region,
        and its config, whose ``payload_signing_enabled = False`` sends UNSIGNED-PAYLOAD."""
        client = self.ops.client
        signer = client._request_signer
        auth = await signer.get_auth_instance(
            signer.signing_name, client.meta.region_name, "s3v4"
        )
        request.context["client_config"] = client.meta.config
        auth.add_auth(request)

    async def _url(self, key: str) -> str:
        """The key's URL as the client resolves it (a presigned GET's, without the query)."""
        if (url := self._urls.get(key)) is None:
            presigned = await self.ops.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.ops.target.bucket, "Key": key}
            )
            url = self._urls[key] = str(presigned).partition("?")[0]
        return url

    async def _connection(self, scheme: str, host: str, port: int | None) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        port = port or (443 if scheme == "https" else 80)
        where = f"{scheme}://{host}:{port}"
        try:
            async with asyncio.timeout(self._connect_timeout + self.ops.read_timeout):
                _, conn = await loop.create_connection(
                    Connection, host, port, ssl=self._ssl if scheme == "https" else None,
                    ssl_handshake_timeout=self.ops.read_timeout if scheme == "https" else None,
                )
        except TimeoutError as exc:
            raise bce.ConnectTimeoutError(endpoint_url=where) from exc
        except ssl.SSLError as exc:
            raise bce.SSLError(endpoint_url=where, error=exc) from exc
        except OSError as exc:
            raise bce.EndpointConnectionError(endpoint_url=where, error=exc) from exc
        return conn

    def _give_back(self, conn: Connection) -> None:
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.close()


class Body:
    """A response body being received; ``close`` returns its connection for reuse when the
    body was read to its end, else closes it."""

    def __init__(self, direct: Direct, conn: Connection, response: Response) -> None:
        self._direct = direct
        self._conn = conn
        self.response = response
        self._done = False

    @property
    def received(self) -> int:
        """Bytes received into the buffer so far (also after a failure)."""
        return self._conn.sunk

    async def filled(self, idle: float) -> None:
        """Wait until the whole body is in the buffer; fail when no byte arrived for
        ``idle`` seconds, or when the connection fails."""
        await self._conn.filled(idle)
        self._done = True

    def close(self) -> None:
        if self._done:
            self._direct._give_back(self._conn)
        else:
            self._conn.close()

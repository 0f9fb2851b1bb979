"""Ranged GETs whose body is received straight into reusable buffers (the restore fast path).

aiohttp hands a response body over as many small ``bytes`` objects (one per socket read,
each through its stream reader's Python bookkeeping); here an ``asyncio.BufferedProtocol``
gives the transport a preallocated 2 MiB buffer to ``recv_into`` instead, so a buffer
fills in a few reads and is passed whole to ``pwrite`` and the hash. The request is signed
by the aiobotocore client (a presigned URL, one per attempt) and written by hand as one
``GET`` with ``Host`` and ``Range``; connections are kept alive and reused, one per range
worker at a time.

Scope: direct plain-HTTP or TLS connections only. When a proxy is configured in the
environment, the endpoint is not http(s), the client uses a client certificate, or
``TRAIND_S3_FASTGET=0`` is set, ``fast_getter`` returns None and restores use the
aiobotocore path of ``s3_download``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from botocore import exceptions as bce
from botocore.httpsession import get_cert_path

from traind.storage.s3_client import Ops

BUFFER = 2 * 1024 * 1024
"""Bytes per receive buffer: a buffer is written and hashed whole, in a worker thread, while
the connection fills its other one. 2 MiB measured ~5% less CPU per byte than 1 MiB; memory
is ``BUFFERS * BUFFER`` per connection, at most ``storage.concurrency`` connections."""
BUFFERS = 2
HEAD_LIMIT = 64 * 1024
"""Largest response head (status line and headers) accepted."""
ERROR_BODY_LIMIT = 256 * 1024
PRESIGN_SECONDS = 3600
PRESIGN_REUSE = 300.0
"""Seconds a presigned URL is reused for a key's ranges and retries (presigning costs ~3 ms
of CPU). Short enough that a URL is never used near the end of the credentials it was
signed with: botocore refreshes temporary credentials 10-15 minutes before they expire."""
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
_OFF = {"0", "false", "no", "off"}


def fast_getter(ops: Ops, connect_timeout: float) -> FastGetter | None:
    """A FastGetter for ``ops``' endpoint, or None where the aiobotocore path must be used."""
    if os.environ.get("TRAIND_S3_FASTGET", "").strip().lower() in _OFF:
        return None
    if any(os.environ.get(name) for name in _PROXY_VARS):
        return None
    client = ops.client
    url = urlsplit(str(client.meta.endpoint_url))
    if url.scheme not in {"http", "https"} or not url.hostname:
        return None
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
    return FastGetter(ops, ctx, connect_timeout)


@dataclass
class Response:
    """A response's status and headers (names lower-cased)."""

    status: int
    headers: dict[str, str]
    version: str

    @property
    def length(self) -> int:
        """Content-Length, or -1 when absent (a chunked or close-delimited body)."""
        value = self.headers.get("content-length", "")
        return int(value) if value.isdigit() else -1

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return conn == "keep-alive"
        return conn != "close"


class _Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection receiving one response at a time into its own buffers."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._head = bytearray(HEAD_LIMIT)
        self._head_len = 0
        self._state = "idle"  # "head", "body", "idle" or "closed"
        self.response: Response | None = None
        self._remaining = 0
        self._free: list[bytearray] = []
        self._made = 0
        self._current: bytearray | None = None
        self._fill = 0
        self._ready: collections.deque[tuple[bytearray, int]] = collections.deque()
        self._paused = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- protocol callbacks (event loop) ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == "head":
            if self._head_len >= HEAD_LIMIT:
                raise ConnectionResetError(f"response head longer than {HEAD_LIMIT} bytes")
            return memoryview(self._head)[self._head_len :]
        if self._state == "body":
            buf = self._buffer()
            return memoryview(buf)[self._fill : min(len(buf), self._fill + self._remaining)]
        # Nothing is expected between responses: take it, then fail the connection.
        return memoryview(self._head)

    def buffer_updated(self, nbytes: int) -> None:
        if self._state == "head":
            self._head_len += nbytes
            self._parse_head(nbytes)
        elif self._state == "body":
            self._fill += nbytes
            self._remaining -= nbytes
            self._settle()
        else:
            self._fail(ConnectionResetError("unexpected bytes from the server between responses"))

    def eof_received(self) -> bool:
        if self._state == "body" and self.response is not None and self.response.length < 0:
            self._remaining = 0  # a close-delimited body ends here
            self._settle()
        elif self._state in {"head", "body"}:
            self._fail(ConnectionResetError(
                f"connection closed with {self._remaining} body bytes still to come"
                if self._state == "body" else "connection closed before a response"))
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._state in {"head", "body"} or exc is not None:
            self._fail(exc or ConnectionResetError("connection lost"))
        self._state = "closed"
        self._wake()

    # -- helpers ------------------------------------------------------------------------------

    def _buffer(self) -> bytearray:
        if self._current is None:
            if self._free:
                self._current = self._free.pop()
            else:
                # Only reached while fewer than BUFFERS exist: reading pauses otherwise.
                self._made += 1
                self._current = bytearray(BUFFER)
        return self._current

    def _parse_head(self, nbytes: int) -> None:
        end = self._head.find(b"\r\n\r\n", max(0, self._head_len - nbytes - 3), self._head_len)
        if end < 0:
            return
        lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest.partition(" ")[0]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            self._fail(ConnectionResetError(f"not an HTTP response: {lines[0][:80]!r}"))
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        response = Response(int(code), headers, version)
        self.response = response
        if "chunked" in headers.get("transfer-encoding", "").lower() and response.status < 300:
            self._fail(ConnectionResetError("chunked ranged GET responses are not supported"))
            return
        length = response.length
        self._remaining = length if length >= 0 else ERROR_BODY_LIMIT
        self._state = "body"
        extra = memoryview(self._head)[end + 4 : self._head_len]
        if len(extra) > self._remaining:
            self._fail(ConnectionResetError("more bytes than the response's Content-Length"))
            return
        if extra:
            buf = self._buffer()
            buf[: len(extra)] = extra
            self._fill = len(extra)
            self._remaining -= len(extra)
        self._settle()

    def _settle(self) -> None:
        """Hand the current buffer over when full or at the body's end; pause when none is
        free."""
        whole = self.response is not None and self.response.length >= 0
        if self._current is not None and (
            self._fill == len(self._current) or not self._remaining or not whole
        ):
            if self._fill:
                self._ready.append((self._current, self._fill))
            else:
                self._free.append(self._current)
            self._current, self._fill = None, 0
        if not self._remaining and self._state == "body":
            self._state = "idle"
        elif not self._free and self._made >= BUFFERS and self._current is None:
            self._pause(True)
        self._wake()

    def _pause(self, pause: bool) -> None:
        if self._transport is None or self._paused == pause or self._transport.is_closing():
            return
        self._paused = pause
        if pause:
            self._transport.pause_reading()
        else:
            self._transport.resume_reading()

    def _fail(self, exc: BaseException) -> None:
        if self._exc is None:
            self._exc = exc
        self._state = "closed"
        if self._transport is not None:
            self._transport.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self, idle: float) -> None:
        if self._exc is not None:
            raise self._exc
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(idle):
                await self._waiter
        finally:
            self._waiter = None
        if self._exc is not None:
            raise self._exc

    # -- the caller's side ------------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        return (self._state == "idle" and self._exc is None and not self._ready
                and self.response is not None and self.response.keep_alive
                and self._transport is not None and not self._transport.is_closing())

    def close(self) -> None:
        self._state = "closed"
        if self._transport is not None:
            self._transport.close()

    async def request(self, data: bytes, idle: float) -> Response:
        """Send one request; return the response's head once it has arrived."""
        assert self._transport is not None
        assert self._state == "idle"
        self._state, self._head_len, self.response = "head", 0, None
        self._free += (buf for buf, _ in self._ready)
        self._ready.clear()
        self._transport.write(data)
        while self.response is None:
            await self._wait(idle)
        return self.response

    async def chunk(self, idle: float) -> tuple[bytearray, int] | None:
        """The next filled buffer and its byte count, or None at the body's end; give it
        back with ``release`` before asking for more than ``BUFFERS`` of them."""
        while not self._ready:
            if self._exc is not None:
                raise self._exc
            if self._state in {"idle", "closed"}:
                return None  # the body ended ("closed" without an error: then the connection)
            await self._wait(idle)
        return self._ready.popleft()

    def release(self, buf: bytearray) -> None:
        self._free.append(buf)
        self._pause(False)


class FastGetter:
    """Presigned ranged GETs over kept-alive connections to one endpoint."""

    def __init__(
        self, ops: Ops, ssl_context: ssl.SSLContext | None, connect_timeout: float
    ) -> None:
        self.ops = ops
        self._connect_timeout = connect_timeout
        self._ssl = ssl_context
        url = urlsplit(str(ops.client.meta.endpoint_url))
        self._endpoint = url
        self._idle: list[_Connection] = []
        self._urls: dict[str, tuple[float, str]] = {}

    def close(self) -> None:
        """Close the idle connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def open(self, key: str, start: int, end: int) -> Body:
        """Send ``GET key`` for bytes ``start`` to ``end - 1``; return the response's body.

        Raises botocore's ClientError for an S3 error response, connection and timeout
        errors as they are: ``s3_errors.retrying`` sorts and translates all of them.
        """
        ops = self.ops
        url = urlsplit(await self._presigned(key))
        target = url.path + (f"?{url.query}" if url.query else "")
        data = (f"GET {target} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"Range: bytes={start}-{end - 1}\r\nAccept-Encoding: identity\r\n"
                "User-Agent: traind\r\n\r\n").encode("latin-1")
        conn = await self._connection(url.scheme, url.hostname or "", url.port)
        try:
            response = await conn.request(data, ops.read_timeout)
            if response.status not in {200, 206}:
                raise await _client_error(conn, response, ops.read_timeout)
        except BaseException:
            conn.close()
            raise
        return Body(self, conn, response)

    async def _presigned(self, key: str) -> str:
        now = time.monotonic()
        signed, url = self._urls.get(key, (0.0, ""))
        if not url or now - signed > PRESIGN_REUSE:
            url = str(await self.ops.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.ops.target.bucket, "Key": key},
                ExpiresIn=PRESIGN_SECONDS,
            ))
            self._urls[key] = (now, url)
        return url

    async def _connection(self, scheme: str, host: str, port: int | None) -> _Connection:
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
                    _Connection, host, port, ssl=self._ssl if scheme == "https" else None,
                    ssl_handshake_timeout=self.ops.read_timeout if scheme == "https" else None,
                )
        except TimeoutError as exc:
            raise bce.ConnectTimeoutError(endpoint_url=where) from exc
        except ssl.SSLError as exc:
            raise bce.SSLError(endpoint_url=where, error=exc) from exc
        except OSError as exc:
            raise bce.EndpointConnectionError(endpoint_url=where, error=exc) from exc
        return conn

    def _give_back(self, conn: _Connection) -> None:
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.close()


class Body:
    """A response body being received; ``close`` returns its connection for reuse when the
    body was read to its end, else closes it."""

    def __init__(self, getter: FastGetter, conn: _Connection, response: Response) -> None:
        self._getter = getter
        self._conn = conn
        self.response = response
        self._done = False

    async def chunk(self, idle: float) -> tuple[bytearray, int] | None:
        got = await self._conn.chunk(idle)
        if got is None:
            self._done = True
        return got

    def release(self, buf: bytearray) -> None:
        self._conn.release(buf)

    def close(self) -> None:
        if self._done:
            self._getter._give_back(self._conn)
        else:
            self._conn.close()


async def _client_error(conn: _Connection, response: Response, idle: float) -> Exception:
    """The botocore ClientError an S3 error response stands for (as the client would raise)."""
    body = bytearray()
    try:
        while (got := await conn.chunk(idle)) is not None:
            buf, n = got
            body += buf[:n]
            conn.release(buf)
            if response.length < 0 and body.endswith(b"0\r\n\r\n"):
                break  # the last chunk of a chunked body
    except (ConnectionError, TimeoutError):
        pass  # the status alone still says what failed
    text = body.decode("utf-8", "replace")

    def field(name: str) -> str:
        found = re.search(f"<{name}>(.*?)</{name}>", text, re.S)
        return found.group(1).strip() if found else ""

    error: dict[str, Any] = {"Code": field("Code") or str(response.status),
                             "Message": field("Message")}
    meta = {"HTTPStatusCode": response.status, "HTTPHeaders": response.headers}
    exc: Exception = bce.ClientError({"Error": error, "ResponseMetadata": meta}, "GetObject")
    return exc

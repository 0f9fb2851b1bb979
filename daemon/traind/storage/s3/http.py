"""A minimal HTTP/1.1 client connection for S3 requests whose bodies are large.

Responses are received through an ``asyncio.BufferedProtocol``: the transport ``recv_into``s
a preallocated buffer instead of handing over one ``bytes`` per socket read (as aiohttp's
stream reader does). A successful body lands straight in the caller's buffer (the ``sink``
of ``request``), which it then writes and hashes whole; other bodies (errors) arrive in the
connection's own small buffers. Request bodies are written in slices as the socket takes
them (the transport's flow control), from the caller's buffer, never joined or copied into
one ``bytes``.
"""

from __future__ import annotations

import asyncio
import collections
import re
from dataclasses import dataclass
from typing import Any

from botocore import exceptions as bce

BUFFER = 64 * 1024
"""Bytes per receive buffer for bodies without a sink (error responses)."""
BUFFERS = 2
SEND_SLICE = 1024 * 1024
"""Bytes of a request body handed to the transport at a time."""
HEAD_LIMIT = 64 * 1024
"""Largest response head (status line and headers) accepted."""
ERROR_BODY_LIMIT = 256 * 1024


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


class Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection: one request at a time, its response received into the
    connection's own buffers."""

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
        self._writable = asyncio.Event()
        self._writable.set()
        self._unsent = False  # a request body was cut short: the connection is out of step
        self._sink: memoryview | None = None
        self.sunk = 0
        """Bytes of the current response body received into the sink."""

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
            if self._sink is not None:
                return self._sink[self.sunk : self.sunk + self._remaining]
            buf = self._buffer()
            return memoryview(buf)[self._fill : min(len(buf), self._fill + self._remaining)]
        # Nothing is expected between responses: take it, then fail the connection.
        return memoryview(self._head)

    def buffer_updated(self, nbytes: int) -> None:
        if self._state == "head":
            self._head_len += nbytes
            self._parse_head(nbytes)
        elif self._state == "body" and self._sink is not None:
            self.sunk += nbytes
            self._remaining -= nbytes
            if not self._remaining:
                self._state, self._sink = "idle", None
                self._wake()
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
        self._writable.set()
        self._wake()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

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
        if self._sink is not None and not (200 <= response.status < 300
                                           and 0 <= length <= len(self._sink)):
            self._sink = None  # an error, or not the body asked for: the caller looks at it
        if self._sink is not None:
            self._sink[: len(extra)] = extra
            self.sunk = len(extra)
            self._remaining -= len(extra)
            if not self._remaining:
                self._state, self._sink = "idle", None
            self._wake()
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
                and not self._unsent and self.response is not None and self.response.keep_alive
                and self._transport is not None and not self._transport.is_closing())

    def close(self) -> None:
        self._state = "closed"
        if self._transport is not None:
            self._transport.close()

    async def request(
        self, head: bytes, body: memoryview | None, idle: float, sink: memoryview | None = None
    ) -> Response:
        """Send one request (``head``, then ``body`` as the socket takes it); return the
        response's head once it has arrived. A 2xx body of at most ``len(sink)`` bytes is
        received into ``sink`` (wait for it with ``filled``); any other into ``chunk``s."""
        transport = self._transport
        assert transport is not None
        assert self._state == "idle"
        self._state, self._head_len, self.response = "head", 0, None
        self._sink, self.sunk = sink, 0
        self._free += (buf for buf, _ in self._ready)
        self._ready.clear()
        transport.write(head)
        for start in range(0, len(body) if body is not None else 0, SEND_SLICE):
            assert body is not None
            if not self._writable.is_set():
                async with asyncio.timeout(idle):
                    await self._writable.wait()
            if self._exc is not None:
                raise self._exc
            if self.response is not None:  # answered early (an error): stop sending
                self._unsent = True
                break
            transport.write(body[start : start + SEND_SLICE])
        while self.response is None:
            await self._wait(idle)
        return self.response

    async def filled(self, idle: float) -> None:
        """Wait until the whole body has landed in the sink (``sunk`` bytes so far); fail
        when no byte arrived for ``idle`` seconds."""
        if self._sink is None and self._state == "body":
            raise ConnectionResetError("the response body is not being received into a sink")
        while self._state == "body":
            seen = self.sunk
            try:
                await self._wait(idle)
            except TimeoutError:
                if self.sunk == seen:
                    raise
        if self._exc is not None:
            raise self._exc

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


async def client_error(
    conn: Connection, response: Response, idle: float, operation: str
) -> Exception:
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
    exc: Exception = bce.ClientError({"Error": error, "ResponseMetadata": meta}, operation)
    return exc

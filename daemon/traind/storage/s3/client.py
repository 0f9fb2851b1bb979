"""The aiobotocore client, built from config, and ``Ops``: one call with retries and translation.

Botocore's own retries are switched off so that every retry goes through one policy and
one log event; request payloads are not SHA-256 signed (``UNSIGNED-PAYLOAD``), the part's
CRC32 — computed while reading, off the event loop — guards the bytes in transit instead.
Bodies go without ``Expect: 100-continue`` (a round trip per request, before the body, that
only spares sending a body the store refuses), under a fixed User-Agent that botocore does
not rebuild per request. Per-request work that does nothing for traind's requests is left
out (``_IDLE_HANDLERS``), and response timestamps are parsed by the standard library.

The request body matters on a host whose cores the trainer (and here, the server) needs:
handing aiohttp one large ``bytes`` makes the 3.11 event loop copy whatever the socket did
not take at once, many times the client CPU of writing the same buffer as 1 MiB memoryview
slices with back-pressure, as ``PartBody`` does (bench/s3_upload.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from botocore import exceptions as bce
from botocore import handlers
from botocore.utils import parse_timestamp as botocore_timestamp

from traind import __version__
from traind.config import S3Storage
from traind.errors import StorageError
from traind.storage.s3.buffers import SMALL_FILES_PER_SLOT
from traind.storage.s3.conditional import PRECONDITION
from traind.storage.s3.errors import BOTOCORE, describe
from traind.storage.s3.target import RetryPolicy, S3Target, retrying

WRITE_SLICE = 1024 * 1024
"""Bytes per write of a request body (``PartBody``)."""
LIST_PAGE = 1000
"""Keys per listing request: S3's most."""
_MIN_SEND_RATE = 256 * 1024
"""Bytes/s below which one request attempt is abandoned as hung (and retried)."""
_IDLE_HANDLERS = (
    ("before-call.s3", handlers.add_expect_header),  # see the module's docstring
    ("request-created", handlers.add_retry_headers),  # botocore's retry count: always 1 here
    ("before-call", handlers.add_recursion_detection_header),  # inside AWS Lambda only
    ("before-call", handlers.inject_api_version_header_if_needed),  # endpoint discovery
    ("before-parameter-build", handlers.generate_idempotent_uuid),  # S3 has no such tokens
    *((f"before-parameter-build.s3.{op}", handlers.sse_md5)  # SSE-C keys: never sent
      for op in ("GetObject", "HeadObject", "PutObject", "UploadPart")),
)
"""Botocore's handlers, run on every request, that do nothing for the requests traind sends
(or, for Expect, cost a round trip): unregistered from each client."""


async def open_client(config: S3Storage, stack: contextlib.AsyncExitStack, target: S3Target) -> Any:
    """Create the S3 client inside ``stack`` (closed with it); raise StorageError if unusable."""
    keys: dict[str, str] = {}
    if config.access_key_id is not None and config.secret_access_key is not None:
        keys["aws_access_key_id"] = config.access_key_id.get_secret_value()
        keys["aws_secret_access_key"] = config.secret_access_key.get_secret_value()
        if config.session_token is not None:
            keys["aws_session_token"] = config.session_token.get_secret_value()
    region = config.region or ("us-east-1" if config.endpoint_url else None)
    session = AioSession(profile=config.profile)
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp)
    aio_config = AioConfig(
        region_name=region,
        signature_version="s3v4",
        s3={"addressing_style": config.addressing_style, "payload_signing_enabled": False},
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=config.concurrency * SMALL_FILES_PER_SLOT + 4,
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        request_checksum_calculation=config.request_checksum_calculation,
        response_checksum_validation="when_required",
        tcp_keepalive=True,
        user_agent=f"traind/{__version__} {session.user_agent()}",
    )
    try:
        manager = session.create_client(
            "s3", endpoint_url=config.endpoint_url, config=aio_config, **keys
        )
        client = await stack.enter_async_context(manager)
    except (bce.BotoCoreError, ValueError) as exc:
        raise StorageError(describe(exc, "create_client", None, target)) from exc
    for event, handler in _IDLE_HANDLERS:
        client.meta.events.unregister(event, handler)
    return client


class PartBody(Payload):
    """A request body over a memoryview, sent in slices without copying.

    It also offers ``read``/``seek``/``tell`` so botocore can measure it and, where a store
    needs a checksum botocore computes itself, read it.
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__(view, content_type="application/octet-stream")
        self._view = view
        self._pos = 0

    @property
    def size(self) -> int:
        return len(self._view)

    def __len__(self) -> int:
        return len(self._view)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._view).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        end = len(self._view) if content_length is None else content_length
        view = self._view[:end]
        for start in range(0, len(view), WRITE_SLICE):
            await writer.write(view[start : start + WRITE_SLICE])

    def read(self, amt: int = -1) -> bytes:
        end = len(self._view) if amt is None or amt < 0 else min(len(self._view), self._pos + amt)
        chunk = bytes(self._view[self._pos : end])
        self._pos = end
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._view)}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def parse_timestamp(value: Any) -> datetime:
    """A timestamp of a response, as botocore's parser gives it (timezone-aware), parsed by
    the standard library when it is S3's usual form: an HTTP date in a header (each GET's
    Last-Modified) or ISO 8601 in a listing; botocore's dateutil parser, much slower,
    takes anything else."""
    if isinstance(value, str):
        try:
            parsed = (email.utils.parsedate_to_datetime(value) if "," in value
                      else datetime.fromisoformat(value))
        except (ValueError, TypeError, IndexError):
            pass
        else:
            if parsed.tzinfo is not None:
                return parsed
    result: datetime = botocore_timestamp(value)
    return result


@dataclass
class Ops:
    """Calls S3 operations on one bucket with the retry policy and error translation."""

    client: Any
    target: S3Target
    policy: RetryPolicy
    read_timeout: float

    async def call(
        self, op: str, key: str | None = None, *, body: memoryview | None = None, **params: Any
    ) -> dict[str, Any]:
        """Run ``op`` (a client method name) with ``Bucket``, ``Key`` and ``Body`` filled in."""
        method = getattr(self.client, op)
        limit = self.limit(len(body) if body is not None else 0)

        async def attempt() -> dict[str, Any]:
            kwargs = dict(params, Bucket=self.target.bucket)
            if key is not None:
                kwargs["Key"] = key
            if body is not None:
                kwargs["Body"] = PartBody(body)
            async with asyncio.timeout(limit):
                result: dict[str, Any] = await method(**kwargs)
            return result

        return await retrying(attempt, op, key, self.target, self.policy, BOTOCORE)

    async def pages(self, prefix: str, **params: Any) -> AsyncIterator[dict[str, Any]]:
        """Each page of ``list_objects_v2`` under ``prefix`` (``LIST_PAGE`` keys a request),
        following continuation tokens. A throttled or failing page is retried by ``call``
        and raised when retries run out, never read as an empty listing."""
        token: str | None = None
        while True:
            extra: dict[str, Any] = {"ContinuationToken": token} if token else {}
            page = await self.call("list_objects_v2", Prefix=prefix, MaxKeys=LIST_PAGE,
                                   **params, **extra)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def limit(self, nbytes: int) -> float:
        """Seconds one attempt that sends ``nbytes`` may take before it is abandoned as hung."""
        return self.read_timeout * 2 + nbytes / _MIN_SEND_RATE


async def put_object(ops: Ops, key: str, data: bytes, **conditions: Any) -> bool:
    """Put ``data`` at the full ``key`` with ``conditions`` (``IfNoneMatch``, ``IfMatch``);
    return False when the store refused it for a condition that did not hold."""
    try:
        await ops.call("put_object", key, body=memoryview(data),
                       ContentType="application/json", **conditions)
    except StorageError as exc:
        if exc.code in PRECONDITION:
            return False
        raise
    return True

"""The aiobotocore client, built from config, and ``Ops``: one call with retries and translation.

Botocore's own retries are switched off so that every retry goes through one policy and
one log event; request payloads are not SHA-256 signed (``UNSIGNED-PAYLOAD``), the part's
CRC32 — computed while reading, off the event loop — guards the bytes in transit instead.
Bodies go without ``Expect: 100-continue`` (a round trip per request, before the body, that
only spares sending a body the store refuses), under a fixed User-Agent that botocore does
not rebuild per request. Per-request work that does nothing for traind's requests is left
out (``_IDLE_HANDLERS``), and response timestamps are parsed by the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore import exceptions as bce
from botocore import handlers
from botocore.utils import parse_timestamp as botocore_timestamp

from traind import __version__
from traind.config import S3Storage
from traind.errors import StorageError
from traind.storage.s3.buffers import PartBody
from traind.storage.s3.errors import RetryPolicy, S3Target, describe, retrying
from traind.util import redact

LIST_PAGE = 1000
"""Keys per listing request: S3's most."""
_MIN_SEND_RATE = 256 * 1024
"""Bytes/s below which one request attempt is abandoned as hung (and retried)."""
SMALL_FILES_PER_SLOT = 16
"""Files sent in one PUT go this many per ``concurrency`` slot: each is one short request,
so its time is mostly waiting for the store's answer, and more of them in flight keep the
connections busy (their bytes stay within ``upload_memory``)."""
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


def target_of(config: S3Storage) -> S3Target:
    """The secret-free description of where requests go."""
    if config.access_key_id is not None:
        creds = "storage.access_key_id/secret_access_key from the config"
    elif config.profile:
        creds = f"AWS profile {config.profile!r}"
    else:
        creds = "the default AWS credential chain (environment, profile, instance role)"
    return S3Target(
        bucket=config.bucket,
        endpoint=redact.url(config.endpoint_url) if config.endpoint_url else "AWS S3",
        region=config.region,
        credentials=creds,
    )


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

        return await retrying(attempt, op, key, self.target, self.policy)

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

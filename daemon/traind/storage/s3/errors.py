"""S3 failures sorted into "retry" and "give up", translated into traind's errors, retried.

A permanent failure (no such bucket, access denied, a wrong key or secret) raises
StorageError at once with a message that names what is wrong. A transient one (connection
reset, 5xx, throttling, a server restarting) is retried with capped exponential backoff and
jitter, then raised as TransientStorageError. An endpoint that never answered (refused, no
DNS answer, connect timeout) may be down for now or misconfigured: it is reported at once,
unretried, as TransientStorageError, and the daemon waits for it while a command says so.
"""

from __future__ import annotations

from typing import TypeVar

import aiohttp
from botocore import exceptions as bce

from traind.errors import StorageError, TransientStorageError
from traind.storage.s3.target import (
    ClientErrors,
    S3Target,
    answer_sentence,
    transient_answer,
)
from traind.util import redact

T = TypeVar("T")


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (``"404"`` for bodiless HEAD errors), else ``""``."""
    if isinstance(exc, bce.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _status(exc: bce.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def is_transient(exc: BaseException, target: S3Target) -> bool:
    """Whether retrying ``exc`` may succeed."""
    if isinstance(exc, bce.ClientError):
        return transient_answer(error_code(exc), _status(exc))
    if isinstance(exc, bce.SSLError | bce.ProxyConnectionError):
        return False
    if isinstance(exc, bce.EndpointConnectionError | bce.ConnectTimeoutError):
        return target.reached
    return isinstance(
        exc,
        bce.HTTPClientError | bce.ConnectionError | bce.IncompleteReadError
        | bce.ChecksumError | aiohttp.ClientError | TimeoutError | ConnectionError,
    )


def describe(exc: BaseException, op: str, key: str | None, target: S3Target) -> str:
    """A precise, secret-free sentence saying what failed and, where known, what to fix
    (the library's words carry the endpoint URL as configured: they are redacted)."""
    return redact.text(_sentence(exc, op, key, target))


def _sentence(exc: BaseException, op: str, key: str | None, target: S3Target) -> str:
    t = target
    where = f"s3://{t.bucket}/{key}" if key else f"bucket {t.bucket!r}"
    at = f"at {t.endpoint}"
    code = error_code(exc)
    if isinstance(exc, bce.ClientError):
        region = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
            "x-amz-bucket-region")
        return answer_sentence(code, _status(exc), exc.response.get("Error", {}).get(
            "Message") or "", op, key, t, region)
    if isinstance(exc, bce.SSLError):
        return f"TLS handshake with {t.endpoint} failed: {exc}"
    if _unreached(exc, t):
        return (f"cannot reach the S3 endpoint {t.endpoint} (down, or storage.endpoint_url "
                f"is wrong): {exc}")
    if isinstance(exc, bce.NoCredentialsError):
        return ("no AWS credentials found: set storage.access_key_id and "
                "storage.secret_access_key, storage.profile, or the AWS_* environment")
    if isinstance(exc, bce.PartialCredentialsError | bce.ProfileNotFound):
        return f"AWS credentials are incomplete: {exc}"
    if isinstance(exc, bce.NoRegionError):
        return "no AWS region configured: set storage.region"
    return f"{op} on {where} {at} failed: {type(exc).__name__}: {exc}"


def _unreached(exc: BaseException, target: S3Target) -> bool:
    """Whether ``exc`` failed to connect to an endpoint that has never answered."""
    return (isinstance(exc, bce.EndpointConnectionError | bce.ConnectTimeoutError)
            and not target.reached)


def translate(
    exc: BaseException, op: str, key: str | None, target: S3Target, note: str = ""
) -> StorageError:
    """The traind error for ``exc`` (raise it ``from exc``), carrying its S3 code and HTTP
    status; ``note`` is added to the message."""
    transient = is_transient(exc, target) or _unreached(exc, target)
    cls = TransientStorageError if transient else StorageError
    status = _status(exc) if isinstance(exc, bce.ClientError) else 0
    return cls(describe(exc, op, key, target) + note, code=error_code(exc),
               status=status or None, key=key, op=op)


_LIBRARY_ERRORS = (
    bce.BotoCoreError, bce.ClientError, aiohttp.ClientError, TimeoutError, ConnectionError,
)


BOTOCORE = ClientErrors(_LIBRARY_ERRORS, lambda exc: isinstance(exc, bce.ClientError),
                       error_code, is_transient, translate)
"""How aiobotocore's failures read."""

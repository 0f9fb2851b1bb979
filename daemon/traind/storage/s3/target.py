"""What both S3 clients share: where requests go (secret-free), the retry policy and its loop,
and the table from S3's answers (error code, HTTP status) to "retry" or a sentence saying
what is wrong. Nothing here imports a client library: each says how its failures read
(``ClientErrors``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from traind.config import S3Storage
from traind.errors import StorageError
from traind.util import redact
from traind.util.retry import Backoff
from traind.util.retry import retrying as retry

log = structlog.get_logger("traind.s3")
T = TypeVar("T")

TRANSIENT_CODES = {
    "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "OperationAborted",
    "IncompleteBody",
}
"""S3's error codes for failures that pass (any 5xx or 429 answer is one too)."""


@dataclass
class S3Target:
    """Where requests go, for error messages: never holds a secret."""

    bucket: str
    endpoint: str
    """The endpoint URL, its credentials masked (``traind.util.redact``)."""
    region: str | None
    credentials: str
    reached: bool = field(default=False)
    """Set once the endpoint has answered anything: later connection errors are restarts."""


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


def transient_answer(code: str, status: int) -> bool:
    """Whether an error answer with S3 ``code`` and HTTP ``status`` may pass on a retry."""
    return code in TRANSIENT_CODES or status >= 500 or status == 429


def answer_sentence(code: str, status: int, message: str, op: str, key: str | None,
                    target: S3Target, bucket_region: str | None = None) -> str:
    """What an error answer means, naming what to fix where S3's ``code`` says
    (``bucket_region``: the ``x-amz-bucket-region`` of a redirect, where the client has it)."""
    t = target
    where = f"s3://{t.bucket}/{key}" if key else f"bucket {t.bucket!r}"
    at = f"at {t.endpoint}"
    if code == "NoSuchBucket" or (code in {"404", "NotFound"} and op == "head_bucket"):
        return f"bucket {t.bucket!r} does not exist {at} (check storage.bucket)"
    if code == "InvalidAccessKeyId":
        return f"the access key id is not known {at} (credentials: {t.credentials})"
    if code == "SignatureDoesNotMatch":
        return (f"the secret access key does not match the access key id {at} "
                f"(credentials: {t.credentials})")
    if code in {"ExpiredToken", "InvalidToken", "TokenRefreshRequired"}:
        return f"the session token is expired or invalid {at} (credentials: {t.credentials})"
    if code in {"AccessDenied", "AllAccessDisabled", "403"}:
        return (f"access denied for {op} on {where} {at}: the credentials "
                f"({t.credentials}) lack permission, or are wrong")
    if code in {"PermanentRedirect", "AuthorizationHeaderMalformed", "301"}:
        return (f"bucket {t.bucket!r} is in {bucket_region or 'another region'}, not in "
                f"{t.region or 'the default'} {at} (set storage.region)")
    if code == "InvalidBucketName":
        return f"bucket name {t.bucket!r} is not valid {at}"
    return f"{op} on {where} {at} failed: {code or status} {message}".rstrip()


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter: ``uniform(base, min(cap, base * 2**n))``
    (never less than ``base``, so a retry never hits a restarting server at once)."""

    retries: int
    base: float = 0.2
    cap: float = 20.0

    @property
    def backoff(self) -> Backoff:
        """The pauses between attempts."""
        return Backoff(self.base, self.cap, jitter=1.0)


@dataclass(frozen=True)
class ClientErrors:
    """How one S3 client's failures read, for ``retrying``."""

    raised: tuple[type[BaseException], ...]
    """What its calls raise when a request fails."""
    answered: Callable[[BaseException], bool]
    """Whether the store answered (the endpoint is reached)."""
    code: Callable[[BaseException], str]
    """The S3 error code of a failure, "" if none."""
    transient: Callable[[BaseException, S3Target], bool]
    """Whether retrying may succeed."""
    translate: Callable[[BaseException, str, str | None, S3Target, str], StorageError]
    """The traind error for a failure of ``op`` on ``key``, a note added to its message."""


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    op: str,
    key: str | None,
    target: S3Target,
    policy: RetryPolicy,
    client: ClientErrors,
    retries: int | None = None,
) -> T:
    """Await ``attempt()`` until it succeeds, a permanent error happens, or retries
    (``retries``, else the policy's) run out; raise the translated error."""

    async def once() -> T:
        try:
            result = await attempt()
        except client.raised as exc:
            if client.answered(exc):
                target.reached = True
            raise
        target.reached = True
        return result

    def retried(exc: BaseException) -> bool:
        # An endpoint never reached is down or misconfigured: the caller decides.
        return isinstance(exc, client.raised) and client.transient(exc, target)

    def logged(exc: BaseException, n: int, pause: float) -> None:
        log.warning("s3_retry", op=op, key=key, attempt=n, delay=round(pause, 2),
                    error=client.code(exc) or type(exc).__name__)

    tries = policy.retries if retries is None else retries
    try:
        return await retry(once, policy.backoff, tries, retried, logged)
    except client.raised as exc:
        note = f" (gave up after {tries + 1} attempts)" if retried(exc) else ""
        raise client.translate(exc, op, key, target, note) from exc

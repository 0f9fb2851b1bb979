"""What both S3 clients share: where requests go (secret-free), the retry policy, and the
table from S3's answers (error code, HTTP status) to "retry" or a sentence saying what is
wrong. Nothing here imports a client library."""

from __future__ import annotations

from dataclasses import dataclass, field

from traind.config import S3Storage
from traind.util import redact
from traind.util.retry import Backoff

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

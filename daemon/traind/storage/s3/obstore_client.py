"""The obstore client (Python bindings to the Rust ``object_store`` crate), built from config,
and ``Calls``: one request with traind's retries and its failures translated.

obstore's own retries are switched off, so every retry goes through one policy and one log
event, as the aiobotocore client's do; the bodies go ``UNSIGNED-PAYLOAD``, guarded by a
SHA-256 checksum header where ``request_checksum_calculation`` asks for one (the only
checksum ``object_store`` sends). obstore reads no AWS profile: with ``storage.profile``
botocore's session finds the credentials (and region), handed over as they refresh.

obstore says what failed in words, not fields: the HTTP status and S3 error code are read
from its message, and go through the table the aiobotocore client uses (``target``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotModifiedError,
    PreconditionError,
)
from obstore.store import S3Store

from traind import __version__
from traind.config import S3Storage
from traind.errors import StorageError, TransientStorageError
from traind.storage.s3.target import (
    ClientErrors,
    RetryPolicy,
    S3Target,
    answer_sentence,
    retrying,
    transient_answer,
)
from traind.util import redact

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config, S3Credential

T = TypeVar("T")
_MIN_SEND_RATE = 256 * 1024
"""Bytes/s below which one request attempt is abandoned as hung (and retried)."""
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_CONNECT = re.compile(r"kind: Connect\b|error trying to connect|Connection refused")
_LIBRARY_ERRORS = (BaseError, FileNotFoundError, TimeoutError, ConnectionError)
"""What an obstore call raises: its own errors, FileNotFoundError for a missing object (404),
TimeoutError for an attempt ``Calls`` gave up on."""


def open_store(config: S3Storage, target: S3Target, retries: int = 0) -> S3Store:
    """The obstore S3 client for ``config`` (no I/O yet), retrying ``retries`` times itself
    (0 but for multipart uploads, whose parts only it sees); raise StorageError if unusable."""
    region = config.region or ("us-east-1" if config.endpoint_url else None)
    s3: S3Config = {"unsigned_payload": True,
                    "virtual_hosted_style_request": config.addressing_style == "virtual" or (
                        config.addressing_style == "auto" and not config.endpoint_url)}
    if config.endpoint_url:
        s3["endpoint"] = config.endpoint_url
    if config.request_checksum_calculation == "when_supported":
        s3["checksum_algorithm"] = "sha256"
    if config.access_key_id is not None and config.secret_access_key is not None:
        s3["access_key_id"] = config.access_key_id.get_secret_value()
        s3["secret_access_key"] = config.secret_access_key.get_secret_value()
        if config.session_token is not None:
            s3["session_token"] = config.session_token.get_secret_value()
    client: ClientConfig = {
        "allow_http": bool(config.endpoint_url and config.endpoint_url.startswith("http:")),
        "connect_timeout": timedelta(seconds=config.connect_timeout),
        "timeout": timedelta(seconds=config.read_timeout * 2),
        "user_agent": f"traind/{__version__} obstore/{obstore.__version__}",
    }
    provider = None
    if config.profile and config.access_key_id is None:
        provider, region = _profile(config.profile, region)
    if region:
        s3["region"] = region
    retry: RetryConfig = {"max_retries": retries, "backoff": {
        "init_backoff": timedelta(seconds=0.2),
        "max_backoff": timedelta(seconds=config.retry_max_delay)}}
    try:
        return S3Store(config.bucket, config=s3, client_options=client,
                       retry_config=retry,
                       credential_provider=provider)
    except (BaseError, ValueError) as exc:
        raise StorageError(f"cannot use the S3 store {target.endpoint}: "
                           f"{_first_line(str(exc))}") from exc


def _profile(profile: str, region: str | None
             ) -> tuple[Callable[[], S3Credential], str | None]:
    """Credentials (refreshed as botocore refreshes them) and the region of AWS ``profile``."""
    from botocore.exceptions import BotoCoreError
    from botocore.session import Session

    try:
        session = Session(profile=profile)
        region = region or session.get_config_variable("region")
    except BotoCoreError as exc:
        raise StorageError(f"AWS credentials are incomplete: {exc}") from exc

    def credentials() -> S3Credential:
        found = session.get_credentials()
        if found is None:
            raise StorageError(f"AWS profile {profile!r} holds no credentials")
        frozen = found.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token,
                "expires_at": datetime.now(UTC) + timedelta(minutes=5)}

    return credentials, region


def _first_line(text: str) -> str:
    return text.split("\n\nDebug source:", 1)[0].split("\n", 1)[0]


@dataclass(frozen=True)
class Answer:
    """What an obstore failure says about the store's answer: its HTTP status (0 when the
    store never answered), S3 error code and message."""

    status: int
    code: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> Answer:
        """Read ``exc``'s words; a condition refused without a body is ``PreconditionFailed``."""
        text = str(exc)
        found = _STATUS.search(text)
        status = int(found.group(1)) if found else 0
        code = (m.group(1) if (m := _CODE.search(text)) else str(status) if status else "")
        if isinstance(exc, AlreadyExistsError | PreconditionError | NotModifiedError
                      ) and code in {"", "412", "409"}:
            code = "PreconditionFailed"
        if isinstance(exc, FileNotFoundError) and not code:
            code = "NotFound"
        message = m.group(1) if (m := _MESSAGE.search(text)) else ""
        return cls(status, code, message)


def is_transient(exc: BaseException, target: S3Target) -> bool:
    """Whether retrying ``exc`` may succeed: a 5xx or throttling answer, a connection lost
    or an attempt timed out; a connection refused only once the endpoint has answered."""
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if not isinstance(exc, BaseError):
        return False
    answer = Answer.of(exc)
    if answer.status:
        return transient_answer(answer.code, answer.status)
    text = str(exc)
    if _CONNECT.search(text):
        return target.reached
    return "HTTP error" in text or "error sending request" in text


def translate(exc: BaseException, op: str, key: str | None, target: S3Target,
              note: str = "") -> StorageError:
    """The traind error for ``exc`` (raise it ``from exc``), as the aiobotocore client's
    ``errors.translate`` gives for the same answer; ``note`` is added to the message."""
    answer = Answer.of(exc)
    unreached = (isinstance(exc, BaseError) and not answer.status and not target.reached
                 and bool(_CONNECT.search(str(exc))))
    if answer.status:
        text = answer_sentence(answer.code, answer.status, answer.message, op, key, target)
    elif unreached:
        text = (f"cannot reach the S3 endpoint {target.endpoint} (down, or "
                f"storage.endpoint_url is wrong): {_first_line(str(exc))}")
    else:
        where = f"s3://{target.bucket}/{key}" if key else f"bucket {target.bucket!r}"
        text = (f"{op} on {where} at {target.endpoint} failed: {type(exc).__name__}: "
                f"{_first_line(str(exc))}")
    cls = TransientStorageError if unreached or is_transient(exc, target) else StorageError
    return cls(redact.text(text) + note, code=answer.code, status=answer.status or None,
               key=key, op=op)


def _answered(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError) or (
        isinstance(exc, BaseError) and Answer.of(exc).status > 0)


OBSTORE = ClientErrors(_LIBRARY_ERRORS, _answered, lambda exc: Answer.of(exc).code,
                       is_transient, translate)
"""How obstore's failures read."""


@dataclass
class Calls:
    """Requests on one bucket through obstore, with the retry policy and error translation."""

    store: S3Store
    target: S3Target
    policy: RetryPolicy
    read_timeout: float

    async def call(self, op: str, key: str | None, request: Callable[[], Awaitable[T]],
                   nbytes: int | None = 0, retries: int | None = None) -> T:
        """Await ``request()`` (one obstore call, ``op`` naming it for messages) until it
        succeeds, fails for good or retries run out (``retries``, else the policy's); each
        attempt is bounded by the time ``nbytes`` may take at the slowest rate accepted
        (None: a call of many requests, a listing's pages, each bounded by the client's
        ``timeout``)."""
        limit = None if nbytes is None else self.read_timeout * 2 + nbytes / _MIN_SEND_RATE

        async def attempt() -> T:
            async with asyncio.timeout(limit):
                return await request()

        return await retrying(attempt, op, key, self.target, self.policy, OBSTORE, retries)

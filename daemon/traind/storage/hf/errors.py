"""``huggingface_hub``'s errors translated at the boundary into traind's: the Hub's
``X-Error-Code`` names kept as codes, 429/5xx/connection failures transient."""

from __future__ import annotations

from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils._http import parse_ratelimit_headers

from traind.errors import StorageError, TransientStorageError
from traind.util import redact

MISSING = "NotFound"
"""The code of a missing file (``StorageError.missing`` is true for it)."""


def status_of(exc: BaseException) -> int | None:
    """The HTTP status behind ``exc`` (or the error it wraps), None without one."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, HfHubHTTPError) and seen.response is not None:
            return int(seen.response.status_code)
        seen = seen.__cause__
    return None


def reset_in(exc: BaseException) -> float | None:
    """Seconds until the Hub's rate limit resets, from a 429's ``RateLimit`` header."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, HfHubHTTPError) and seen.response is not None:
            info = parse_ratelimit_headers(seen.response.headers)
            if info is not None and info.remaining == 0:
                return float(info.reset_in_seconds)
            retry = seen.response.headers.get("Retry-After", "")
            return float(retry) if retry.isdigit() else None
        seen = seen.__cause__
    return None


def translate(exc: BaseException, where: str, op: str, key: str | None = None) -> StorageError:
    """A StorageError for ``exc`` (raised doing ``op`` at ``where``), transient where a
    retry may succeed; the Hub's message kept, never a credential."""
    status = status_of(exc)
    inner = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ else exc
    said = " ".join(line.strip() for line in str(inner).splitlines() if line.strip())
    said = redact.text(said)  # the request's URL: a self-hosted endpoint's password
    message = f"{where}: {op}: {said[:600] or type(inner).__name__}"
    if isinstance(inner, EntryNotFoundError):
        code = MISSING
    elif isinstance(inner, RevisionNotFoundError):
        code = "RevisionNotFound"
    elif isinstance(inner, RepositoryNotFoundError):
        code = "RepoNotFound"
    else:
        code = "" if status is None else str(status)
    if status == 401 and code != "RepoNotFound":
        message += " (the token is not valid: check HF_TOKEN or [storage] token)"
    transient = status is None and isinstance(inner, (OSError, ConnectionError, TimeoutError))
    if status is None and type(inner).__module__.startswith("httpx"):
        transient = True  # a transport failure: refused, reset, timed out
    if status is not None and (status == 429 or status >= 500):
        transient = True
    cls = TransientStorageError if transient else StorageError
    return cls(message, code=code, status=status, key=key, op=op)

"""JSON over HTTP for the REST adapters (vast.ai, RunPod, Lambda): one aiohttp request loop
with the key in a header, bounded retries and a pace that also keeps a server's
``Retry-After``.

Reads and deletes are retried on 5xx, 429 and connection errors; a create only on 429 (the
server refused it unprocessed), never on a 5xx or a lost answer, which could rent twice. Every
wait longer than a moment is logged (``launch_api_waiting``), so a rate-limited launch says why
it is slow.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import structlog
from pydantic import SecretStr

from traind.errors import TraindError
from traind.launch.config import CloudSection
from traind.launch.errors import BackendAPIError, InstanceNotFoundError
from traind.util.retry import Backoff, retrying

log = structlog.get_logger("traind.launch")
Headers = Callable[[], Mapping[str, str]]
"""Builds the request headers (the key is read when a request is made, not before)."""


def bearer(key: Callable[[], SecretStr]) -> Headers:
    """Headers sending ``key()`` as a Bearer token."""
    return lambda: {"Authorization": f"Bearer {key().get_secret_value()}"}


class _Retryable(TraindError):
    """A 5xx or 429 answer; ``after`` is the server's Retry-After in seconds, if it sent one."""

    def __init__(self, message: str, status: int, after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.after = after


_FAILURES = (_Retryable, aiohttp.ClientError, TimeoutError, ValueError)
"""What a request may fail with; all but an undecodable answer (ValueError) may pass."""


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form), or None."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class Pace:
    """Keeps requests at least ``interval`` seconds apart per key, and holds them back until a
    time a server named."""

    def __init__(self) -> None:
        self._next: dict[str, float] = {}

    def hold(self, key: str, seconds: float) -> None:
        """No request of ``key`` before ``seconds`` from now."""
        self._next[key] = max(self._next.get(key, 0.0), time.monotonic() + seconds)

    async def wait(
        self, paces: Sequence[tuple[str, float]], backend: str, path: str
    ) -> None:
        """Sleep until every key of ``paces`` allows a request, then book each key's next
        slot its interval after now."""
        ready = max(self._next.get(key, 0.0) for key, _ in paces)
        if (delay := ready - time.monotonic()) > 0:
            if delay >= 0.05:
                log.info("launch_api_waiting", backend=backend, path=path, reason="pace",
                         seconds=round(delay, 3))
            await asyncio.sleep(delay)
        now = time.monotonic()
        for key, interval in paces:
            self._next[key] = now + interval


class RestAPI:
    """Requests to one provider's API base URL. ``paces`` are (path prefix, min interval)
    pairs; every one whose prefix starts a path paces it ("" matches all)."""

    def __init__(
        self, backend: str, url: str, config: CloudSection, headers: Headers,
        paces: Sequence[tuple[str, float]] = (),
    ) -> None:
        self.backend = backend
        self.url = url.rstrip("/")
        self.config = config
        self.headers = headers
        self.paces = paces
        self.pace = Pace()

    async def call(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None, retry: bool = True,
    ) -> tuple[int, Any]:
        """One API request → (HTTP status, decoded JSON); BackendAPIError when it keeps failing.
        ``retry=False`` (creates) retries only a 429."""
        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout)
        paces = [(p, i) for p, i in self.paces if path.startswith(p)] or [("", 0.0)]

        async def attempt() -> tuple[int, Any]:
            await self.pace.wait(paces, self.backend, path)
            headers = {"Accept": "application/json", **self.headers()}
            async with (
                aiohttp.ClientSession(timeout=timeout, headers=headers) as session,
                session.request(method, self.url + path, params=params, json=body) as resp,
            ):
                text = await resp.text()
                if resp.status >= 500 or resp.status == 429:
                    after = retry_after(resp.headers.get("Retry-After"))
                    raise _Retryable(f"HTTP {resp.status}: {text[:200]}", resp.status, after)
                return resp.status, json.loads(text) if text.strip() else {}

        def passing(exc: BaseException) -> bool:
            if isinstance(exc, _Retryable) and exc.status == 429:
                return True
            return retry and isinstance(exc, _FAILURES) and not isinstance(exc, ValueError)

        def logged(exc: BaseException, n: int, delay: float) -> None:
            if isinstance(exc, _Retryable) and exc.status == 429:
                wait = exc.after if exc.after is not None else delay
                for key, _ in paces:
                    self.pace.hold(key, wait)
                log.info("launch_api_waiting", backend=self.backend, path=path,
                         reason="rate limited (HTTP 429)", seconds=round(wait, 3))
                return
            log.warning("launch_api_retry", backend=self.backend, method=method, path=path,
                        attempt=n, retry_in=delay, error=_reason(exc))

        backoff = Backoff(cfg.backoff_initial, cfg.backoff_max)
        try:
            return await retrying(attempt, backoff, cfg.retries, passing, logged)
        except _FAILURES as exc:
            raise BackendAPIError(f"{self.backend} {method} {path}: {_reason(exc)}") from exc

    async def read(self, path: str, what: str, describe: Callable[[Any], str]) -> Any:
        """GET ``path``'s record: InstanceNotFoundError on 404, BackendAPIError on another
        error, both in the provider's words (``describe`` of the answer)."""
        status, data = await self.call("GET", path)
        if status == 404:
            raise InstanceNotFoundError(f"{self.backend} {what}: {describe(data)}")
        if status >= 400:
            raise BackendAPIError(f"{self.backend} {what}: HTTP {status}: {describe(data)}")
        return data

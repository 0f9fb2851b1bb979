"""huggingface_hub's Jobs API, called from asyncio: each call in a thread, failures that may
pass (5xx, a dropped connection) retried with util.retry, every other one translated into a
LaunchError that names what the Hub refused and why, in its own words.

huggingface_hub (2.4.0) sends ``POST /api/jobs/{ns}`` (run_job), ``GET /api/jobs/{ns}/{id}``
(inspect_job), ``POST /api/jobs/{ns}/{id}/cancel`` (cancel_job), ``GET /api/jobs/{ns}`` paged
by ``Link`` (list_jobs) and the server-sent ``GET /api/jobs/{ns}/{id}/logs`` (fetch_job_logs).
The token is its own (``$HF_TOKEN`` or the login file) and travels only in its headers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import httpx2
import structlog
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, JobNotFoundError, LocalTokenNotFoundError

from traind.launch.config import HFJobsSection
from traind.launch.errors import (
    BackendAPIError,
    InstanceNotFoundError,
    LaunchError,
)
from traind.util.retry import Backoff, retrying

log = structlog.get_logger("traind.launch")
T = TypeVar("T")
BACKEND = "hf-jobs"
REFUSALS = {
    400: "the Hub refused the job as asked",
    401: "the Hub refused the token: set HF_TOKEN to a valid token, or run `hf auth login`",
    402: "the Hub asks for payment: add a payment method or credits to the namespace",
    403: "the token may not run jobs in this namespace (a fine-grained token needs the "
         "Jobs permission)",
    429: "the Hub refused it for a quota or rate limit",
}
"""What a refusal means, by HTTP status, said before the Hub's own words."""


def passing(exc: BaseException) -> bool:
    """Whether ``exc`` (or the library failure it translates) may pass when tried again: a
    5xx, or a connection that failed."""
    if isinstance(exc, LaunchError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, HfHubHTTPError):
        return exc.response.status_code >= 500
    return isinstance(exc, httpx2.TransportError)


def translate(
    exc: Exception, what: str, refused: type[LaunchError] = BackendAPIError
) -> LaunchError:
    """The LaunchError for a failed ``what``: ``refused`` for a 4xx refusal."""
    if isinstance(exc, LocalTokenNotFoundError):
        return refused(f"{BACKEND} {what}: no Hugging Face token: set HF_TOKEN, or run "
                       "`hf auth login`")
    if isinstance(exc, JobNotFoundError):
        return InstanceNotFoundError(f"{BACKEND} {what}: no such job")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code
        said = exc.server_message or str(exc).strip().splitlines()[0]
        if status in REFUSALS:
            return refused(f"{BACKEND} {what}: {REFUSALS[status]} (HTTP {status}: {said})")
        return BackendAPIError(f"{BACKEND} {what}: HTTP {status}: {said}")
    return BackendAPIError(f"{BACKEND} {what}: {exc or type(exc).__name__}")


class JobsAPI:
    """One namespace's jobs through ``HfApi`` (``endpoint`` empty: huggingface_hub's)."""

    def __init__(self, config: HFJobsSection) -> None:
        self.config = config
        self.api = HfApi(endpoint=config.endpoint or None)
        self._namespace = config.namespace

    async def namespace(self) -> str:
        """The configured namespace, else the token's own user (asked once)."""
        if not self._namespace:
            me = await self.call(self.api.whoami, "whoami")
            self._namespace = str(me["name"])
        return self._namespace

    async def call(
        self, fn: Callable[..., T], what: str, *, retry: bool = True,
        refused: type[LaunchError] = BackendAPIError, **kwargs: Any,
    ) -> T:
        """``fn(**kwargs)`` in a thread; passing failures retried unless ``retry`` is off."""
        return await self.retried(lambda: self.once(fn, what, refused, **kwargs), what, retry)

    async def once(
        self, fn: Callable[..., T], what: str, refused: type[LaunchError] = BackendAPIError,
        **kwargs: Any,
    ) -> T:
        """``fn(**kwargs)`` in a thread, tried once, its failure translated."""
        try:
            return await asyncio.to_thread(fn, **kwargs)
        except (HfHubHTTPError, httpx2.HTTPError, LocalTokenNotFoundError) as exc:
            raise translate(exc, what, refused) from exc

    async def retried(
        self, attempt: Callable[[], Awaitable[T]], what: str, retry: bool = True
    ) -> T:
        """``attempt()`` until it succeeds or fails for good; each retry logged."""
        cfg = self.config

        def logged(exc: BaseException, n: int, delay: float) -> None:
            log.warning("launch_api_retry", backend=BACKEND, path=what, attempt=n,
                        retry_in=round(delay, 3), error=str(exc).splitlines()[0])

        backoff = Backoff(cfg.backoff_initial, cfg.backoff_max, jitter=0.2)
        return await retrying(attempt, backoff, cfg.retries if retry else 0, passing, logged)

    async def lines(self, job_id: str, follow: bool, tail: int | None) -> AsyncIterator[str]:
        """The job's log lines, read by huggingface_hub in a daemon thread (its blocking
        stream cannot be interrupted; a daemon thread does not hold the process open)."""
        namespace = await self.namespace()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, str | Exception | None]] = asyncio.Queue()
        stop = threading.Event()

        def put(kind: str, item: str | Exception | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, item))

        def read() -> None:
            try:
                stream: Iterable[str] = self.api.fetch_job_logs(
                    job_id=job_id, namespace=namespace, follow=follow, tail=tail
                )
                for line in stream:
                    if stop.is_set():
                        return
                    put("line", line)
            except Exception as exc:  # handed to the loop, translated there
                put("error", exc)
            put("end", None)

        threading.Thread(target=read, name=f"hf-jobs-logs-{job_id}", daemon=True).start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "line" and isinstance(item, str):
                    yield item
                elif isinstance(item, Exception):
                    raise translate(item, f"logs of job {job_id}") from item
                else:
                    return
        finally:
            stop.set()

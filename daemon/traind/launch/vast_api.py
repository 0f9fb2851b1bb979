"""vast.ai's REST API: the request loop (Bearer key, bounded retries) and the pure mapping
of its records onto launch's values. Documented shapes; see vast.py for the endpoints used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import structlog

from traind.launch.base import Constraints, HostState, Offer
from traind.launch.config import VastSection
from traind.launch.errors import BackendAPIError
from traind.util.retry import Backoff, retrying

log = structlog.get_logger("traind.launch")

_LOADING = {None, "", "loading", "created", "scheduling", "starting", "rebooting"}
_STOPPED = {"stopped", "exited", "frozen", "offline"}


def normalise_state(record: Mapping[str, Any]) -> HostState:
    """vast.ai's ``actual_status`` / ``cur_state`` as a HostState."""
    actual = record.get("actual_status")
    if record.get("cur_state") == "unloaded":
        return HostState.DESTROYED
    if actual == "running":
        return HostState.RUNNING
    if actual in _LOADING:
        return HostState.LOADING
    return HostState.STOPPED if actual in _STOPPED else HostState.UNKNOWN


def offer_from(record: Mapping[str, Any]) -> Offer:
    """One search result, normalised (``gpu_ram`` is in MB, ``duration`` in seconds)."""
    duration = record.get("duration")
    return Offer(
        backend="vast", id=str(record["id"]), gpu_name=str(record.get("gpu_name") or ""),
        num_gpus=int(record.get("num_gpus") or 0),
        price_per_hour=float(record.get("dph_total") or 0.0),
        gpu_ram_gb=float(record.get("gpu_ram") or 0.0) / 1024,
        disk_gb=float(record.get("disk_space") or 0.0),
        download_mbps=float(record.get("inet_down") or 0.0),
        reliability=float(record.get("reliability2", record.get("reliability")) or 0.0),
        max_duration_hours=float(duration) / 3600 if duration is not None else None,
        location=str(record.get("geolocation") or ""), raw=dict(record),
    )


def search_query(c: Constraints, verified_only: bool, limit: int) -> dict[str, Any]:
    """The ``q`` JSON of a search: the constraints as server-side filters, cheapest first."""
    q: dict[str, Any] = {
        "rentable": {"eq": True}, "rented": {"eq": False}, "num_gpus": {"gte": c.num_gpus},
        "order": [["dph_total", "asc"]], "type": "on-demand", "limit": limit,
    }
    if verified_only:
        q["verified"] = {"eq": True}
    if c.gpu:
        q["gpu_name"] = {"in": [g.replace("_", " ") for g in c.gpu]}
    for field, value in (("gpu_ram", c.min_gpu_ram_gb * 1024), ("disk_space", c.min_disk_gb),
                         ("inet_down", c.min_download_mbps),
                         ("reliability2", c.min_reliability),
                         ("duration", c.duration_hours * 3600)):
        if value:
            q[field] = {"gte": value}
    if c.max_price_per_hour is not None:
        q["dph_total"] = {"lte": c.max_price_per_hour}
    return q


class _Retryable(Exception):
    """A 5xx or 429 answer."""


_FAILURES = (_Retryable, aiohttp.ClientError, TimeoutError, ValueError)
"""What a request may fail with; all but an undecodable answer (ValueError) may pass."""


def _passing(exc: BaseException) -> bool:
    return isinstance(exc, _FAILURES) and not isinstance(exc, ValueError)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class VastAPI:
    """Requests to one vast.ai API base URL. The key is sent only in the Authorization header."""

    def __init__(self, config: VastSection) -> None:
        self.config = config

    async def call(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None, retry: bool = True,
    ) -> tuple[int, Any]:
        """One API request → (HTTP status, decoded JSON); BackendAPIError when it keeps failing."""
        cfg = self.config
        headers = {"Authorization": f"Bearer {cfg.key().get_secret_value()}",
                   "Accept": "application/json"}
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout)

        async def attempt() -> tuple[int, Any]:
            async with (
                aiohttp.ClientSession(timeout=timeout, headers=headers) as session,
                session.request(method, cfg.url.rstrip("/") + path, params=params,
                                json=body) as resp,
            ):
                text = await resp.text()
                if resp.status >= 500 or resp.status == 429:
                    raise _Retryable(f"HTTP {resp.status}: {text[:200]}")
                return resp.status, json.loads(text) if text.strip() else {}

        def logged(exc: BaseException, n: int, delay: float) -> None:
            log.warning("vast_api_retry", method=method, path=path, attempt=n,
                        retry_in=delay, error=_reason(exc))

        backoff = Backoff(cfg.backoff_initial, cfg.backoff_max)
        try:
            return await retrying(attempt, backoff, cfg.retries if retry else 0, _passing,
                                  logged)
        except _FAILURES as exc:
            raise BackendAPIError(f"vast.ai {method} {path}: {_reason(exc)}") from exc


def is_missing(data: dict[str, Any]) -> bool:
    text = f"{data.get('error', '')} {data.get('msg', '')}".lower()
    return "no_such" in text or "not found" in text or "does not exist" in text


def message(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("msg") or data.get("error") or data)[:200]
    return str(data)[:200]

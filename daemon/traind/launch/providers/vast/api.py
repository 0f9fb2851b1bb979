"""vast.ai's REST API: the pure mapping of its records onto launch's values. Documented
shapes; see vast.py for the endpoints used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traind.launch.base import Constraints, HostState, Offer

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


def is_missing(data: dict[str, Any]) -> bool:
    """Whether an error answer says the instance does not exist."""
    text = f"{data.get('error', '')} {data.get('msg', '')}".lower()
    return "no_such" in text or "not found" in text or "does not exist" in text


def message(data: Any) -> str:
    """The provider's own words in an answer."""
    if isinstance(data, dict):
        return str(data.get("msg") or data.get("error") or data)[:200]
    return str(data)[:200]

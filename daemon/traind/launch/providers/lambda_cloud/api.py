"""Lambda Cloud's public REST API v1, the pure part: instance types and instances mapped onto
launch's values (shapes from its OpenAPI document, info.version 1.10.0)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from traind.launch.base import HostState, Offer

_STATES = {
    "booting": HostState.LOADING, "active": HostState.RUNNING, "unhealthy": HostState.UNKNOWN,
    "terminating": HostState.STOPPED, "preempted": HostState.STOPPED,
    "terminated": HostState.DESTROYED,
}
_GPU = re.compile(r"^(?P<model>.*?)\s*\((?P<gb>\d+(?:\.\d+)?)\s*GB\s*(?P<form>[^)]*)\)\s*$")
GIB = 1.073741824
"""Gigabytes per gibibyte."""


def normalise_state(instance: Mapping[str, Any]) -> HostState:
    """An instance's ``status`` (InstanceStatus) as a HostState."""
    return _STATES.get(str(instance.get("status")), HostState.UNKNOWN)


def gpu_model(description: str) -> tuple[str, float]:
    """``"H100 (80 GB SXM5)"`` → ``("H100 SXM5", 80.0)``; a description in another shape
    is the model as it is, memory unknown."""
    match = _GPU.match(description)
    if match is None:
        return description.strip(), 0.0
    return f"{match['model']} {match['form']}".strip(), float(match["gb"])


def offers_from(types: Mapping[str, Mapping[str, Any]], regions: Sequence[str]) -> list[Offer]:
    """One offer per instance type and region with capacity (``regions`` narrows them).
    Lambda publishes no reliability or bandwidth figure."""
    offers = []
    for name, item in types.items():
        spec = item.get("instance_type") or {}
        specs = spec.get("specs") or {}
        model, gb = gpu_model(str(spec.get("gpu_description") or ""))
        for region in item.get("regions_with_capacity_available") or []:
            if regions and region.get("name") not in regions:
                continue
            offers.append(Offer(
                backend="lambda", id=f"{name}@{region['name']}", gpu_name=model,
                num_gpus=int(specs.get("gpus") or 0),
                price_per_hour=float(spec.get("price_cents_per_hour") or 0) / 100,
                gpu_ram_gb=gb, disk_gb=float(specs.get("storage_gib") or 0) * GIB,
                download_mbps=float("inf"), location=str(region["name"]),
                raw={"instance_type": name, "region": dict(region)},
            ))
    return offers


def error_code(data: Any) -> str:
    """The ``error.code`` of an error answer, or ""."""
    error = data.get("error") if isinstance(data, dict) else None
    return str(error.get("code") or "") if isinstance(error, dict) else ""


def message(data: Any) -> str:
    """The provider's own words in an error answer: code, message and suggestion."""
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return str(data)[:200]
    text = f"{error.get('message')} [{error.get('code')}]"
    return f"{text}; {error['suggestion']}" if error.get("suggestion") else text

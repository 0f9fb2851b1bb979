"""Nebius AI Cloud, the pure part: its platforms and presets as offers, its instance states,
the boot cloud-init, and what a gRPC error means to a launch (from nebius/api's
``nebius/compute/v1/{platform,instance}.proto`` and ``nebius/common/v1/error.proto``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from traind.launch.base import HostState, Offer

GIB = 1.073741824
"""Gigabytes per gibibyte."""
_STATES = {
    "CREATING": HostState.LOADING, "UPDATING": HostState.LOADING, "STARTING": HostState.LOADING,
    "RUNNING": HostState.RUNNING, "STOPPING": HostState.STOPPED, "STOPPED": HostState.STOPPED,
    "DELETING": HostState.STOPPED, "ERROR": HostState.STOPPED,
}
_VENDOR = re.compile(r"^(NVIDIA|AMD)\W*\s*", re.IGNORECASE)


def normalise_state(state: str) -> HostState:
    """An ``InstanceStatus.InstanceState`` name as a HostState."""
    return _STATES.get(state, HostState.UNKNOWN)


def gpu_name(short: str, long: str, platform: str) -> str:
    """The model a platform's GPUs are, vendor dropped (``"NVIDIA H100 NVLink"`` →
    ``"H100 NVLink"``), so ``[constraints] gpu`` matches it as it does elsewhere."""
    return _VENDOR.sub("", short or long or platform).strip()


def offer(
    platform: str, preset: str, name: str, gpus: int, gpu_memory_gib: float, price: float,
) -> Offer:
    """One (platform, preset) as an offer: the boot disk is sized on request, and Nebius
    publishes no reliability or bandwidth figure."""
    return Offer(
        backend="nebius", id=f"{platform}/{preset}", gpu_name=name, num_gpus=gpus,
        price_per_hour=price, gpu_ram_gb=gpu_memory_gib * GIB, disk_gb=float("inf"),
        download_mbps=float("inf"), raw={"platform": platform, "preset": preset},
    )


def cloud_init(user: str, public_key: str) -> str:
    """The user-data that creates ``user`` with our key and passwordless sudo."""
    return (
        "#cloud-config\nusers:\n"
        f"  - name: {user}\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    shell: /bin/bash\n"
        f"    ssh_authorized_keys:\n      - {public_key.strip()}\n"
    )


def public_address(addresses: Iterable[str]) -> str:
    """The first public IPv4 of an instance's interfaces, without its ``/32``."""
    return next((a.split("/", 1)[0] for a in addresses if a), "")


def kind_of(code: str, details: Mapping[str, bool]) -> str:
    """What a failed call means: "rate" (too many requests: wait), "quota", "capacity",
    "missing", "auth", "transient" or "other", from its status code and which
    ServiceError details it carries."""
    if code == "RESOURCE_EXHAUSTED":
        if details.get("too_many_requests"):
            return "rate"
        return "capacity" if details.get("not_enough_resources") else "quota"
    return {"NOT_FOUND": "missing", "UNAUTHENTICATED": "auth", "PERMISSION_DENIED": "auth",
            "UNAVAILABLE": "transient", "DEADLINE_EXCEEDED": "transient",
            "INTERNAL": "transient"}.get(code, "other")

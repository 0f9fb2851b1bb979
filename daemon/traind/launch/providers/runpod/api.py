"""RunPod's REST API v2, the pure part: its GPU catalogue and pods mapped onto launch's values
(shapes from ``api-reference-v2/openapi.json``, info.version 2.0.0)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from traind.launch.base import HostState, Offer

_STATES = {
    "PROVISIONING": HostState.LOADING, "STARTING": HostState.LOADING,
    "RUNNING": HostState.RUNNING, "EXITED": HostState.STOPPED, "ERROR": HostState.STOPPED,
    "TERMINATED": HostState.DESTROYED,
}


def normalise_state(pod: Mapping[str, Any]) -> HostState:
    """A pod's ``status`` (PodStatus) as a HostState."""
    return _STATES.get(str(pod.get("status")), HostState.UNKNOWN)


def offers_from(
    gpus: Sequence[Mapping[str, Any]], cloud: str, count: int, data_centers: Sequence[str]
) -> list[Offer]:
    """One offer per GPU type and data center with stock (``availability`` not NONE) in
    ``cloud``, for ``count`` GPUs; the price is the per-GPU list price times the count. RunPod
    publishes no reliability or bandwidth, and the disk is whatever the pod asks for."""
    tier = cloud.lower()
    offers = []
    for gpu in gpus:
        if not gpu.get(tier) or int((gpu.get("maxCount") or {}).get(tier) or 0) < count:
            continue
        price = float((gpu.get("price") or {}).get(tier) or 0.0) * count
        for dc in gpu.get("dataCenters") or []:
            if dc.get("availability") in (None, "NONE"):
                continue
            if data_centers and dc.get("id") not in data_centers:
                continue
            offers.append(Offer(
                backend="runpod", id=f"{gpu['id']}@{dc['id']}", gpu_name=str(gpu.get("name")),
                num_gpus=count, price_per_hour=price, gpu_ram_gb=float(gpu.get("memory") or 0),
                disk_gb=float("inf"), download_mbps=float("inf"), location=str(dc["id"]),
                raw={"gpu": dict(gpu), "dataCenter": dict(dc)},
            ))
    return offers


def ssh_address(pod: Mapping[str, Any], private_port: int) -> tuple[str, int] | None:
    """Where the pod's sshd answers: the public side of its ``private_port`` TCP mapping in
    ``runtime.ports``, else the ``ssh.direct`` block; None until it has one."""
    for mapping in (pod.get("runtime") or {}).get("ports") or []:
        if (mapping.get("private") == private_port and mapping.get("public")
                and mapping.get("ip") and mapping.get("type") == "tcp"):
            return str(mapping["ip"]), int(mapping["public"])
    direct = (pod.get("ssh") or {}).get("direct")
    if direct and direct.get("host") and direct.get("port"):
        return str(direct["host"]), int(direct["port"])
    return None


def message(data: Any) -> str:
    """The provider's own words in an error answer (problem+json ``detail`` and ``errors``)."""
    if isinstance(data, dict) and ("detail" in data or "title" in data):
        errors = "; ".join(str(e) for e in data.get("errors") or [])
        return f"{data.get('detail') or data.get('title')}" + (f" ({errors})" if errors else "")
    return str(data)[:200]

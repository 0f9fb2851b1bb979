"""The Docker Engine's REST API through aiodocker (0.27), one client per call, every
failure translated into a LaunchError that names what the engine refused and why.

The engine is ``[docker] host``, else ``$DOCKER_HOST``, else ``unix:///var/run/docker.sock``
(always given to aiodocker, so no Docker context file changes it). An engine it cannot
reach is aiodocker's status 900.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiodocker

from traind.launch.errors import (
    BackendAPIError,
    InstanceNotFoundError,
    LaunchError,
    ProvisionError,
)

BACKEND = "docker"
DEFAULT_HOST = "unix:///var/run/docker.sock"
UNREACHABLE = 900
"""aiodocker's status for a connection that failed."""


class EngineUnreachableError(BackendAPIError):
    """The Docker Engine cannot be reached."""


class ImageNotFoundError(ProvisionError):
    """The engine has no such image."""


class GPURequestError(ProvisionError):
    """The engine cannot give the container the GPUs asked for."""


def translate(exc: aiodocker.DockerError, what: str, host: str) -> LaunchError:
    """The LaunchError for a failed ``what`` on the engine at ``host``."""
    said = exc.message.strip()
    if exc.status == UNREACHABLE:
        if "Permission denied" in said:
            return EngineUnreachableError(
                f"{BACKEND} {what}: no permission on the Docker socket {host}: run as root "
                "or as a member of the docker group")
        return EngineUnreachableError(
            f"{BACKEND} {what}: cannot reach the Docker Engine at {host}: is dockerd "
            f"running? Set [docker] host or DOCKER_HOST ({said})")
    if exc.status == 404 and "image" in said.lower():
        return ImageNotFoundError(f"{BACKEND} {what}: the engine has no image: {said} "
                                  "(build or pull it first)")
    if exc.status == 404:
        return InstanceNotFoundError(f"{BACKEND} {what}: {said}")
    if "device driver" in said or "gpu" in said.lower():
        return GPURequestError(f"{BACKEND} {what}: the GPUs asked for cannot be given: {said}")
    if exc.status < 500:
        return ProvisionError(f"{BACKEND} {what}: the engine refused it (HTTP {exc.status}: "
                              f"{said})")
    return BackendAPIError(f"{BACKEND} {what}: HTTP {exc.status}: {said}")


def docker_host(configured: str) -> str:
    """The engine's address: ``configured``, else ``$DOCKER_HOST``, else the default."""
    return configured or os.environ.get("DOCKER_HOST") or DEFAULT_HOST


@asynccontextmanager
async def engine(host: str, what: str) -> AsyncIterator[aiodocker.Docker]:
    """A client for the engine at ``host`` for one operation ``what``; engine failures
    inside the block raised translated."""
    try:
        async with aiodocker.Docker(url=host) as docker:
            yield docker
    except aiodocker.DockerError as exc:
        raise translate(exc, what, host) from exc

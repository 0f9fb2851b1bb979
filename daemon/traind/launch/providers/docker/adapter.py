"""The ``docker`` adapter: a launch is one container on a Docker Engine, running
``traind run`` as its entrypoint.

The engine has no job timeout and no secret store for plain containers. So the container
ends itself at ``[docker] timeout``: a sleeper started beside the command sends it SIGTERM,
as ``docker stop`` would, whether or not a ``traind launch`` follows it (and one that looks
at a container past its timeout stops it too, for an image without ``sleep``). The timeout
rides along as a label, so a new shell reports the end as TIMEOUT. Secrets reach the
container as environment variables.
States: ``created`` is PENDING, ``running`` (or paused, restarting) RUNNING, ``exited``
with 0 COMPLETED, with anything else ERROR (``OOMKilled`` said), removed GONE.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import aiodocker
import structlog

from traind.launch.base import Handle
from traind.launch.config import DockerSection
from traind.launch.errors import InstanceNotFoundError
from traind.launch.jobs import LABEL, JobSpec, JobState, JobStatus
from traind.launch.providers.docker.engine import BACKEND, docker_host, engine

log = structlog.get_logger("traind.launch")
TIMEOUT_LABEL = "traind-timeout"
LIVE = ["created", "running", "restarting", "paused"]
_RESEND = 5
"""Seconds between the timeout's SIGTERMs to a container's command that is still there."""


def _seconds(started: str, finished: str | None) -> float | None:
    """Seconds between two of the engine's timestamps (``finished`` None: now)."""
    if started.startswith("0001"):
        return None
    begin = datetime.fromisoformat(started[:26].rstrip("Z") + "+00:00")
    end = (datetime.fromisoformat(finished[:26].rstrip("Z") + "+00:00")
           if finished and not finished.startswith("0001") else None)
    return ((end.timestamp() if end else time.time()) - begin.timestamp())


def status_of(info: dict[str, Any]) -> JobStatus:
    """A container's inspect answer, normalised (see the module docstring)."""
    state = info["State"]
    timeout = float(info["Config"]["Labels"].get(TIMEOUT_LABEL) or 0)
    ran = _seconds(state["StartedAt"], state["FinishedAt"] if not state["Running"] else None)
    flavor = info["Config"]["Labels"].get("traind-flavor", "")
    status = str(state["Status"])
    if status == "created":
        return JobStatus(JobState.PENDING, "created", flavor, running_seconds=ran)
    if status in ("running", "restarting", "paused"):
        return JobStatus(JobState.RUNNING, status, flavor, running_seconds=ran)
    if status == "removing":
        return JobStatus(JobState.GONE, "being removed", flavor, running_seconds=ran)
    code = int(state["ExitCode"])
    message = f"exited with status {code}"
    if state.get("OOMKilled"):
        message += " (OOMKilled: the container ran out of memory)"
    if state.get("Error"):
        message += f": {state['Error']}"
    if timeout > 0 and ran is not None and ran >= timeout:
        return JobStatus(JobState.TIMEOUT, f"stopped at its timeout of {timeout:.0f}s; "
                         + message, flavor, running_seconds=ran)
    if code == 0:
        return JobStatus(JobState.COMPLETED, message, flavor, running_seconds=ran)
    return JobStatus(JobState.ERROR, message, flavor, running_seconds=ran)


def bounded(command: Sequence[str], timeout: float) -> list[str]:
    """``command``, sent SIGTERM after ``timeout`` seconds (0: never) by a sleeper beside it.
    The shell's PID, which the sleeper signals, is the command's once ``exec`` hands it on,
    so traind stays PID 1 and ends as on ``docker stop``: it commits, then exits. The signal
    is sent again every few seconds until it is gone: PID 1 ignores one that arrives before
    its handler is installed."""
    if timeout <= 0:
        return list(command)
    sleeper = (f"(sleep {math.ceil(timeout)} && while kill -TERM $$ 2>/dev/null; "
               f"do sleep {_RESEND}; done) &")
    return ["sh", "-c", f'{sleeper} exec "$@"', "sh", *command]


def container_config(spec: JobSpec, config: DockerSection) -> dict[str, Any]:
    """The ``POST /containers/create`` body of ``spec``: its command as the entrypoint, so
    an image's own ENTRYPOINT (the container recipe's ``traind run``) is not prepended."""
    host: dict[str, Any] = {"NetworkMode": config.network, "Binds": list(config.mounts)}
    if config.gpus:
        count = -1 if config.gpus == "all" else config.gpus
        host["DeviceRequests"] = [{"Driver": "nvidia", "Count": count,
                                   "Capabilities": [["gpu"]]}]
    env = {**spec.env, **spec.secrets}
    return {
        "Image": spec.image, "Entrypoint": bounded(spec.command, spec.timeout),
        "Env": [f"{key}={value}" for key, value in env.items()],
        "Labels": {**spec.labels, LABEL: spec.label, TIMEOUT_LABEL: str(spec.timeout),
                   "traind-flavor": spec.flavor},
        "StopTimeout": int(config.stop_timeout), "HostConfig": host,
    }


class DockerBackend:
    """One Docker Engine."""

    name = BACKEND

    def __init__(self, config: DockerSection) -> None:
        self.config = config
        self.host = docker_host(config.host)

    async def submit(self, spec: JobSpec) -> Handle:
        """Create and start the container; one that cannot start is removed again."""
        body = container_config(spec, self.config)
        async with engine(self.host, f"start a container of image {spec.image}") as docker:
            container = await docker.containers.create(body)
            try:
                await container.start()
            except BaseException:
                with contextlib.suppress(aiodocker.DockerError):
                    await container.delete(force=True)
                raise
        log.info("launch_job_submitted", backend=BACKEND, job=container.id, image=spec.image,
                 flavor=spec.flavor, timeout=spec.timeout)
        return Handle(BACKEND, container.id, spec.label, gpu_name=spec.flavor,
                      created_at=time.time())

    async def inspect(self, handle: Handle) -> JobStatus:
        """The container's state; one past its timeout is stopped first (TIMEOUT)."""
        try:
            async with engine(self.host, f"inspect container {handle.instance_id[:12]}") as d:
                info = await d.containers.container(handle.instance_id).show()
                status = status_of(info)
                if status.state is JobState.RUNNING and self._overdue(status):
                    await self._stop(d, handle.instance_id, "timeout")
                    info = await d.containers.container(handle.instance_id).show()
                    status = status_of(info)
        except InstanceNotFoundError as exc:
            return JobStatus(JobState.GONE, str(exc))
        return status

    def _overdue(self, status: JobStatus) -> bool:
        return (self.config.timeout > 0 and status.running_seconds is not None
                and status.running_seconds >= self.config.timeout)

    async def _stop(self, docker: aiodocker.Docker, container_id: str, why: str) -> None:
        """``POST /containers/{id}/stop``: SIGTERM, SIGKILL after ``stop_timeout``."""
        log.info("launch_container_stopping", backend=BACKEND, job=container_id, reason=why,
                 grace=self.config.stop_timeout)
        await docker.containers.container(container_id).stop(t=int(self.config.stop_timeout))

    async def logs(
        self, handle: Handle, follow: bool, tail: int | None = None
    ) -> AsyncIterator[str]:
        """The container's stdout and stderr (demultiplexed), line by line."""
        what = f"logs of container {handle.instance_id[:12]}"
        async with engine(self.host, what) as docker:
            container = docker.containers.container(handle.instance_id)
            pending = ""
            async for chunk in _chunks(container, follow, "all" if tail is None else tail):
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    yield line
            if pending:
                yield pending

    async def cancel(self, handle: Handle) -> None:
        """Stop (SIGTERM, SIGKILL after ``stop_timeout``) and remove the container."""
        what = f"stop and remove container {handle.instance_id[:12]}"
        try:
            async with engine(self.host, what) as docker:
                container = docker.containers.container(handle.instance_id)
                info = await container.show()
                if info["State"]["Running"]:
                    await self._stop(docker, handle.instance_id, "cancel")
                await container.delete(force=True)
        except InstanceNotFoundError:
            return

    async def running(self, label: str) -> list[str]:
        """The engine's containers labelled with this launch that are created or running."""
        async with engine(self.host, f"list containers labelled {LABEL}={label}") as docker:
            found = await docker.containers.list(
                all=True, filters={"label": [f"{LABEL}={label}"], "status": LIVE})
        return [str(c.id) for c in found]


async def _chunks(
    container: aiodocker.containers.DockerContainer, follow: bool, tail: str | int
) -> AsyncIterator[str]:
    """The log's chunks as aiodocker gives them: a stream when following, else a list."""
    if follow:
        async for chunk in container.log(stdout=True, stderr=True, follow=True, tail=tail):
            yield chunk
    else:
        for chunk in await container.log(stdout=True, stderr=True, tail=tail):
            yield chunk

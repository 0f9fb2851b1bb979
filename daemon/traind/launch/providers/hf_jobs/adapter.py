"""The ``hf-jobs`` adapter: a launch is one Hugging Face Job running ``traind run``.

The job's stages (``SCHEDULING``, ``RUNNING``, ``COMPLETED``, ``CANCELED``, ``ERROR``,
``DELETED``: huggingface_hub's ``JobStage``) are normalised to JobState. The platform reports
a job it ended at its timeout as ``ERROR``; it is told apart by its message or by having run
as long as its timeout. Its handle's ``instance_id`` is ``<namespace>/<job id>``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
from huggingface_hub import JobInfo

from traind.launch.base import Handle
from traind.launch.config import HFJobsSection
from traind.launch.errors import InstanceNotFoundError, ProvisionError
from traind.launch.jobs import LABEL, JobSpec, JobState, JobStatus
from traind.launch.providers.hf_jobs.client import BACKEND, JobsAPI

log = structlog.get_logger("traind.launch")
STAGES = {"SCHEDULING": JobState.PENDING, "RUNNING": JobState.RUNNING,
          "COMPLETED": JobState.COMPLETED, "CANCELED": JobState.CANCELLED,
          "ERROR": JobState.ERROR, "DELETED": JobState.GONE}
LIVE_STAGES = ["SCHEDULING", "RUNNING"]


def status_of(info: JobInfo, timeout: float) -> JobStatus:
    """A JobInfo, normalised (see the module docstring for a timeout)."""
    message = info.status.message or ""
    state = STAGES.get(str(info.status.stage), JobState.ERROR)
    ran = info.durations.running_secs if info.durations else None
    timed_out = "timeout" in message.lower() or "timed out" in message.lower() or (
        timeout > 0 and ran is not None and ran >= timeout
    )
    if state is JobState.ERROR and timed_out:
        state = JobState.TIMEOUT
    return JobStatus(state, message, str(info.flavor or ""), info.url,
                     None if ran is None else float(ran))


def job_of(handle: Handle) -> tuple[str, str]:
    """(namespace, job id) of a handle."""
    namespace, _, job_id = handle.instance_id.rpartition("/")
    return namespace, job_id


class HFJobsBackend:
    """Hugging Face Jobs in one namespace."""

    name = BACKEND

    def __init__(self, config: HFJobsSection) -> None:
        self.config = config
        self.api = JobsAPI(config)

    async def submit(self, spec: JobSpec) -> Handle:
        """``run_job``. A 5xx is retried only once the listing shows no job of this launch,
        so a lost answer never starts two."""
        namespace = await self.api.namespace()
        kwargs: dict[str, Any] = {
            "image": spec.image, "command": list(spec.command), "env": dict(spec.env),
            "secrets": dict(spec.secrets), "flavor": spec.flavor or None,
            "timeout": int(spec.timeout) or None, "namespace": namespace, "name": spec.label,
            "labels": {**spec.labels, LABEL: spec.label},
        }
        what = f"run job in {namespace} (image {spec.image}, flavor {spec.flavor})"

        tried: list[bool] = []

        async def attempt() -> str:
            if tried and (found := await self.running(spec.label)):
                log.warning("launch_create_answer_lost_instance_found", backend=BACKEND,
                            instance=found[0], label=spec.label)
                return found[0]
            tried.append(True)
            info = await self.api.once(self.api.api.run_job, what, ProvisionError, **kwargs)
            return str(info.id)

        job_id = await self.api.retried(attempt, what)
        log.info("launch_job_submitted", backend=BACKEND, job=job_id, namespace=namespace,
                 image=spec.image, flavor=spec.flavor, timeout=spec.timeout)
        return Handle(BACKEND, f"{namespace}/{job_id}", spec.label, gpu_name=spec.flavor,
                      created_at=time.time())

    async def inspect(self, handle: Handle) -> JobStatus:
        """``inspect_job``; a job the Hub does not know is GONE."""
        namespace, job_id = job_of(handle)
        try:
            info = await self.api.call(self.api.api.inspect_job, f"inspect job {job_id}",
                                       job_id=job_id, namespace=namespace)
        except InstanceNotFoundError as exc:
            return JobStatus(JobState.GONE, str(exc))
        return status_of(info, self.config.timeout)

    async def logs(
        self, handle: Handle, follow: bool, tail: int | None = None
    ) -> AsyncIterator[str]:
        """``fetch_job_logs``: the job's stdout, line by line."""
        _, job_id = job_of(handle)
        async for line in self.api.lines(job_id, follow, tail):
            yield line

    async def cancel(self, handle: Handle) -> None:
        """``cancel_job``, unless the job has ended already."""
        namespace, job_id = job_of(handle)
        if (await self.inspect(handle)).state.ended:
            return
        await self.api.call(self.api.api.cancel_job, f"cancel job {job_id}",
                            job_id=job_id, namespace=namespace)

    async def running(self, label: str) -> list[str]:
        """``list_jobs`` of the launch's label in SCHEDULING or RUNNING (every page)."""
        namespace = await self.api.namespace()

        def listed() -> list[JobInfo]:
            return list(self.api.api.list_jobs(status=LIVE_STAGES, labels={LABEL: label},
                                               namespace=namespace))

        jobs = await self.api.call(listed, f"list jobs labelled {LABEL}={label}")
        return [f"{namespace}/{job.id}" for job in jobs]

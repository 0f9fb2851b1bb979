"""Adapters by name, imported only when chosen (a vast user never imports the nebius SDK)."""

from __future__ import annotations

from traind.launch.base import HostBackend
from traind.launch.config import LaunchConfig
from traind.launch.handles import LaunchStore
from traind.launch.jobs import JobBackend
from traind.util.runtime import load

BACKENDS = {
    "local": "traind.launch.providers.local.adapter:LocalBackend",
    "ssh": "traind.launch.providers.ssh.adapter:SSHBackend",
    "vast": "traind.launch.providers.vast.adapter:VastBackend",
    "runpod": "traind.launch.providers.runpod.adapter:RunPodBackend",
    "lambda": "traind.launch.providers.lambda_cloud.adapter:LambdaBackend",
    "nebius": "traind.launch.providers.nebius.adapter:NebiusBackend",
}
JOB_BACKENDS = {
    "hf-jobs": "traind.launch.providers.hf_jobs.adapter:HFJobsBackend",
    "docker": "traind.launch.providers.docker.adapter:DockerBackend",
    "modal": "traind.launch.providers.modal.adapter:ModalBackend",
}
"""Container-job platforms: the job is the run (launch/jobs.py)."""


def open_backend(config: LaunchConfig, store: LaunchStore) -> HostBackend:
    """The adapter ``config.backend`` names, built from its section (no I/O)."""
    cls = load(BACKENDS, config.backend)
    if config.backend == "local":
        backend: HostBackend = cls(store)
    elif config.backend == "ssh":
        backend = cls(config.ssh, store, config.host.ssh_key)
    else:
        section = {"vast": config.vast, "runpod": config.runpod, "lambda": config.lambda_,
                   "nebius": config.nebius}[config.backend]
        backend = cls(section, store, config.host.ssh_key)
    return backend


def open_job_backend(config: LaunchConfig) -> JobBackend:
    """The job platform ``config.backend`` names, built from its section (no I/O)."""
    backend: JobBackend = load(JOB_BACKENDS, config.backend)(config.job_section())
    return backend

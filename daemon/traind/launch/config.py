"""``launch.toml``: which backend, what host, what to run there. Frozen models, loaded once.

Relative local paths (code_dir, traind_config, ssh_key, pull.dir, a host's identity_file and
known_hosts) are resolved against the directory of the launch.toml that names them, so a
saved launch keeps working from any directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from traind.config import Section, read_toml
from traind.errors import ConfigError
from traind.launch.base import Constraints
from traind.launch.credentials import api_key, assignment_key, toml_key
from traind.launch.host.packages import traind_requirements
from traind.layout.keys import check_component
from traind.util.units import Duration, PositiveDuration


def _local_path(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base") or Path.cwd()
    return (Path(base) / value.expanduser()).resolve()


LocalPath = Annotated[Path, AfterValidator(_local_path)]


class ConstraintsSection(Section):
    """``[constraints]``: what the host must offer (see launch/ranking.py for the matching)."""

    gpu: tuple[str, ...] = ()
    num_gpus: int = Field(default=1, ge=0)
    min_gpu_ram_gb: float = Field(default=0.0, ge=0)
    min_disk_gb: float = Field(default=0.0, ge=0)
    min_download_mbps: float = Field(default=0.0, ge=0)
    min_reliability: float = Field(default=0.0, ge=0, le=1)
    duration: Duration = 0.0
    max_price_per_hour: float | None = Field(default=None, ge=0)

    @field_validator("gpu", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else v

    def to_constraints(self) -> Constraints:
        """The backend-neutral value."""
        return Constraints(
            gpu=self.gpu, num_gpus=self.num_gpus, min_gpu_ram_gb=self.min_gpu_ram_gb,
            min_disk_gb=self.min_disk_gb, min_download_mbps=self.min_download_mbps,
            min_reliability=self.min_reliability, duration_hours=self.duration / 3600,
            max_price_per_hour=self.max_price_per_hour,
        )


class RunSection(Section):
    """``[run]``: the code and the traind config to put on the host, and where."""

    code_dir: LocalPath
    traind_config: LocalPath
    remote_dir: str = "traind-launch"
    excludes: tuple[str, ...] = (".git", "__pycache__", "*.pyc", ".venv", ".mypy_cache")
    includes: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    max_recoveries: int = Field(default=3, ge=0)

    @field_validator("remote_dir")
    @classmethod
    def _usable(cls, v: str) -> str:
        if not v.strip() or "\0" in v or v.startswith("~"):
            raise ValueError("must be a path on the host (relative = under the login's home)")
        return v.rstrip("/") or "/"


class HostSection(Section):
    """``[host]``: what to ask the backend for, and what to do when things go wrong."""

    image: str = "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
    disk_gb: float = Field(default=50.0, gt=0)
    ssh_key: LocalPath = Field(default=Path("~/.ssh/id_ed25519"), validate_default=True)
    wait_running: Duration = 900.0
    unreachable_after: PositiveDuration = 600.0
    """Seconds a followed host may not answer SSH, while its provider lists it running,
    before it is destroyed and the run recovered on a new one."""
    on_failure: Literal["teardown", "keep"] = "teardown"
    on_finish: Literal["keep", "down"] = "keep"


class InstallSection(Section):
    """``[install]``: how traind is put on the host and run there."""

    python: str = "python3"
    venv: bool = True
    extras: tuple[str, ...] = ("s3", "ssh")
    requirements: tuple[str, ...] = ()
    service: Literal["auto", "systemd", "nohup"] = "auto"
    stop_timeout: Duration = 90.0
    step_timeout: Duration = 900.0

    @model_validator(mode="after")
    def _known_extras(self) -> InstallSection:
        if self.venv:
            self.packages()
        return self

    def packages(self) -> list[str]:
        """What pip installs into the venv: traind's own requirements and its ``extras``'
        (from its package metadata), then ``requirements`` (the run's own)."""
        return [*traind_requirements(self.extras), *self.requirements]


class PullSection(Section):
    """``[pull]``: where ``pull`` and ``down`` put checkpoints (``<dir>/<name>/<tag>``)."""

    dir: LocalPath = Field(default=Path("checkpoints"), validate_default=True)


class CloudSection(Section):
    """What every rented-instance backend shares: polling, SSH into the instance, teardown,
    and (for the HTTP APIs) request timeouts and retries."""

    ssh_user: str = "root"
    ssh_port: int = Field(default=22, ge=1, le=65535)
    poll_interval: Duration = 5.0
    teardown_timeout: Duration = 300.0
    request_timeout: Duration = 30.0
    retries: int = Field(default=4, ge=0)
    backoff_initial: Duration = 1.0
    backoff_max: Duration = 20.0


class VastSection(CloudSection):
    """``[vast]``: the vast.ai REST API."""

    api_key: SecretStr | None = None
    url: str = "https://console.vast.ai"
    verified_only: bool = True
    search_limit: int = Field(default=64, ge=1)

    def key(self) -> SecretStr:
        """The API key: from the file, else ``$VAST_API_KEY``, else the vastai CLI's file."""
        return api_key(self.api_key, "vast", "VAST_API_KEY",
                       [Path("~/.config/vastai/vast_api_key"), Path("~/.vast_api_key")])


class RunPodSection(CloudSection):
    """``[runpod]``: RunPod's REST API v2 (pods)."""

    api_key: SecretStr | None = None
    url: str = "https://api.runpod.io"
    cloud: Literal["SECURE", "COMMUNITY"] = "SECURE"
    data_centers: tuple[str, ...] = ()

    def key(self) -> SecretStr:
        """The API key: from the file, else ``$RUNPOD_API_KEY``, else runpodctl's config."""
        return api_key(self.api_key, "runpod", "RUNPOD_API_KEY",
                       [Path("~/.runpod/config.toml")], toml_key)


class LambdaSection(CloudSection):
    """``[lambda]``: Lambda Cloud's public REST API v1 (on-demand instances)."""

    api_key: SecretStr | None = None
    url: str = "https://cloud.lambda.ai"
    ssh_user: str = "ubuntu"
    regions: tuple[str, ...] = ()
    request_interval: Duration = 1.0
    launch_interval: Duration = 12.0

    def key(self) -> SecretStr:
        """The API key: from the file, else $LAMBDA_API_KEY, else ~/.lambda_cloud/lambda_keys."""
        return api_key(self.api_key, "lambda", "LAMBDA_API_KEY",
                       [Path("~/.lambda_cloud/lambda_keys")], assignment_key)


class NebiusSection(CloudSection):
    """``[nebius]``: Nebius AI Cloud through its Python SDK (gRPC). Credentials come from
    ``$NEBIUS_IAM_TOKEN`` or the nebius CLI's profile (``~/.nebius/config.yaml``)."""

    project_id: str = ""
    subnet_id: str = ""
    endpoint: str = ""
    tls: bool = True
    ssh_user: str = "ubuntu"
    image_family: str = "ubuntu22.04-cuda12"
    platforms: tuple[str, ...] = ()
    disk_type: Literal["network_ssd", "network_ssd_non_replicated", "network_ssd_io_m3",
                       "network_hdd"] = "network_ssd"


def _env_names(value: tuple[str, ...]) -> tuple[str, ...]:
    for name in value:
        if not name.isidentifier():
            raise ValueError(f"{name!r} is not an environment variable name")
    return value


EnvNames = Annotated[tuple[str, ...], AfterValidator(_env_names)]
"""Names of environment variables whose values go to a job as its secrets."""


class JobSection(Section):
    """What every container-job platform's table has: the image (with traind in it), the
    timeout, the names of the environment variables passed on as platform secrets, labels,
    the traind command in the image, and how the launch polls."""

    image: str = ""
    timeout: Duration = 1800.0
    secrets: EnvNames = ()
    labels: dict[str, str] = Field(default_factory=dict)
    traind: str = "traind"
    poll_interval: Duration = 5.0
    cancel_timeout: Duration = 120.0

    def hardware(self) -> str:
        """The platform's name for the hardware asked for (a flavor, a GPU)."""
        raise NotImplementedError


class HFJobsSection(JobSection):
    """``[hf_jobs]``: Hugging Face Jobs through huggingface_hub's Jobs API. The API token is
    huggingface_hub's own (``$HF_TOKEN``, else ``hf auth login``'s file); ``endpoint`` empty
    means ``$HF_ENDPOINT``, else huggingface.co."""

    flavor: str = "cpu-basic"
    namespace: str = ""
    secrets: EnvNames = ("HF_TOKEN",)
    endpoint: str = ""
    retries: int = Field(default=4, ge=0)
    backoff_initial: Duration = 1.0
    backoff_max: Duration = 20.0

    def hardware(self) -> str:
        """The Jobs flavor."""
        return self.flavor


class ModalSection(JobSection):
    """``[modal]``: a Modal Sandbox through the official ``modal`` client. Its token is the
    client's own (``$MODAL_TOKEN_ID`` and ``$MODAL_TOKEN_SECRET``, else ``modal token set``'s
    file); ``gpu`` in Modal's words (``"H100"``, ``"A100-80GB:2"``), empty for none."""

    gpu: str = ""
    app: str = "traind"
    environment: str = ""

    def hardware(self) -> str:
        """The GPU string."""
        return self.gpu


class DockerSection(JobSection):
    """``[docker]``: a Docker Engine through its REST API (aiodocker). ``host`` empty means
    ``$DOCKER_HOST``, else ``unix:///var/run/docker.sock``. Docker has no secret store for
    plain containers: ``secrets`` reach the container as environment variables. ``gpus`` is
    a count or ``"all"`` (DeviceRequests, driver nvidia); ``network`` a Docker network mode;
    ``mounts`` are ``"host path:container path"`` bind mounts (a local store's directory)."""

    flavor: str = ""
    gpus: int | Literal["all"] = 0
    timeout: Duration = 0.0
    host: str = ""
    network: str = "host"
    mounts: tuple[str, ...] = ()
    poll_interval: Duration = 1.0
    cancel_timeout: Duration = 60.0
    stop_timeout: Duration = 30.0

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f'gpus = {v}: a count (0 for none) or "all"')
        return v

    def hardware(self) -> str:
        """The flavor named in the table (a label: the engine has no flavors)."""
        return self.flavor


class SSHHost(Section):
    """One ``[[ssh.hosts]]`` entry: a host you already have, and what it offers."""

    name: str
    host: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str = "root"
    identity_file: LocalPath | None = None
    known_hosts: LocalPath = Field(default=Path("~/.ssh/known_hosts"), validate_default=True)
    gpu: str = ""
    num_gpus: int = Field(default=0, ge=0)
    gpu_ram_gb: float = 0.0
    disk_gb: float = 0.0
    download_mbps: float = 0.0
    price_per_hour: float = 0.0

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return check_component(v, "host name")


class SSHSection(Section):
    """``[ssh]``: the inventory of hosts for ``backend = "ssh"``."""

    hosts: tuple[SSHHost, ...] = ()
    connect_timeout: Duration = 20.0


class LaunchConfig(Section):
    """The whole launch.toml."""

    name: str
    backend: Literal["local", "ssh", "vast", "runpod", "lambda", "nebius", "hf-jobs",
                     "docker", "modal"]
    run: RunSection
    constraints: ConstraintsSection = ConstraintsSection()
    host: HostSection = HostSection()
    install: InstallSection = Field(default_factory=InstallSection)  # checked when loaded
    pull: PullSection = PullSection()
    vast: VastSection = VastSection()
    runpod: RunPodSection = RunPodSection()
    lambda_: LambdaSection = Field(default=LambdaSection(), alias="lambda")
    nebius: NebiusSection = NebiusSection()
    hf_jobs: HFJobsSection = HFJobsSection()
    docker: DockerSection = DockerSection()
    modal: ModalSection = ModalSection()
    ssh: SSHSection = SSHSection()

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return check_component(v, "launch name")

    @model_validator(mode="after")
    def _backend_section(self) -> LaunchConfig:
        if self.backend == "ssh" and not self.ssh.hosts:
            raise ValueError('backend = "ssh" needs at least one [[ssh.hosts]] entry')
        if self.backend == "nebius" and not self.nebius.subnet_id:
            raise ValueError('backend = "nebius" needs [nebius] subnet_id (nebius vpc subnet list)')
        if self.backend == "hf-jobs" and not self.hf_jobs.image:
            raise ValueError('backend = "hf-jobs" needs [hf_jobs] image (one with traind in it)')
        if self.backend == "docker" and not self.docker.image:
            raise ValueError('backend = "docker" needs [docker] image (one with traind in it)')
        if self.backend == "modal" and not self.modal.image:
            raise ValueError('backend = "modal" needs [modal] image (one with traind in it)')
        return self

    def job_section(self) -> JobSection:
        """The table of the container-job platform ``backend`` names."""
        tables: dict[str, JobSection] = {"hf-jobs": self.hf_jobs, "modal": self.modal,
                                         "docker": self.docker}
        return tables[self.backend]

    def remote_root(self, name: str | None = None) -> str:
        """Where this launch lives on the host: ``<run.remote_dir>/<name>``."""
        return f"{self.run.remote_dir}/{name or self.name}"


def load(path: Path, overrides: dict[str, Any] | None = None) -> LaunchConfig:
    """Read and validate launch.toml; raise ConfigError listing every problem."""
    data = read_toml(path)
    data.update(overrides or {})
    for section in ("constraints", "host", "install", "pull", "vast", "runpod", "lambda",
                    "nebius", "hf_jobs", "docker", "modal", "ssh"):
        data.setdefault(section, {})  # validated here, so default paths resolve beside the file
    try:
        return LaunchConfig.model_validate(data, context={"base": path.resolve().parent})
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        raise ConfigError(problems, str(path)) from exc

"""The backend-neutral interface: a small Protocol and the frozen values it passes around.

An adapter turns one way of getting a host (this machine, an SSH inventory, a GPU market)
into these eight steps. Constructing an adapter does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

LineSink = Callable[[str], None]
"""Receives each line a remote command prints on stdout (without the newline)."""


class HostState(StrEnum):
    """A host's state, normalised across backends."""

    LOADING = "loading"
    RUNNING = "running"
    STOPPED = "stopped"
    DESTROYED = "destroyed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Constraints:
    """What a host must offer. Empty ``gpu`` means any model; ``num_gpus`` is a minimum."""

    gpu: tuple[str, ...] = ()
    num_gpus: int = 1
    min_gpu_ram_gb: float = 0.0
    min_disk_gb: float = 0.0
    min_download_mbps: float = 0.0
    min_reliability: float = 0.0
    duration_hours: float = 0.0
    max_price_per_hour: float | None = None


@dataclass(frozen=True)
class Offer:
    """One rentable host, normalised; ``raw`` keeps the backend's own record."""

    backend: str
    id: str
    gpu_name: str
    num_gpus: int
    price_per_hour: float
    gpu_ram_gb: float = 0.0
    disk_gb: float = 0.0
    download_mbps: float = 0.0
    reliability: float = 1.0
    max_duration_hours: float | None = None
    location: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class SSHEndpoint:
    """Where and as whom to log in; ``known_hosts`` is the file that vouches for the host key."""

    host: str
    port: int
    user: str
    identity_file: str | None = None
    known_hosts: str | None = None

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


@dataclass(frozen=True)
class Handle:
    """A provisioned host: enough to reach, inspect and destroy it from a new shell."""

    backend: str
    instance_id: str
    label: str
    endpoint: SSHEndpoint | None = None
    offer_id: str = ""
    gpu_name: str = ""
    num_gpus: int = 0
    price_per_hour: float = 0.0
    created_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Handle:
        """The inverse of ``to_json``."""
        values = dict(data)
        if values.get("endpoint") is not None:
            values["endpoint"] = SSHEndpoint(**values["endpoint"])
        return cls(**values)


@dataclass(frozen=True)
class HostStatus:
    """What a backend knows about a host right now."""

    state: HostState
    gpu_name: str = ""
    num_gpus: int = 0
    uptime_seconds: float | None = None
    endpoint: SSHEndpoint | None = None
    message: str = ""


@dataclass(frozen=True)
class RemoteResult:
    """How a remote command ended: exit code (128+N for signal N), seconds, stderr's tail."""

    exit_code: int
    seconds: float
    stderr_tail: str = ""


class HostBackend(Protocol):
    """A way to get a host and work on it. Every step raises a LaunchError subclass."""

    name: str

    async def search_offers(self, constraints: Constraints) -> list[Offer]:
        """Offers that satisfy ``constraints``, cheapest first."""
        ...

    async def provision(
        self, offer: Offer, disk: float, image: str, ssh_public_key: str, label: str
    ) -> Handle:
        """Rent or claim the host of ``offer`` (``disk`` in GB); ProvisionError when refused."""
        ...

    async def wait_running(self, handle: Handle, timeout: float) -> Handle:  # noqa: ASYNC109
        """Wait until the host runs and return the handle, now with its SSH endpoint."""
        ...

    async def sync_to(
        self, handle: Handle, local: Path, remote: str, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """Copy a local file or directory's contents to ``remote`` on the host."""
        ...

    async def run_remote(
        self, handle: Handle, command: str | Sequence[str],
        env: Mapping[str, str] | None = None, stream: LineSink | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - kills the remote command
    ) -> RemoteResult:
        """Run a shell command line (or an argv) on the host; raise on timeout, not on exit."""
        ...

    async def sync_from(
        self, handle: Handle, remote: str, local: Path, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False,
    ) -> None:
        """Copy a file or directory's contents from ``remote`` on the host to ``local``."""
        ...

    async def status(self, handle: Handle) -> HostStatus:
        """The host's normalised state; a host that is gone is DESTROYED, not an error."""
        ...

    async def teardown(self, handle: Handle) -> None:
        """Destroy or release the host. Idempotent: one already gone is a warning."""
        ...

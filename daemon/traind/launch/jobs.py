"""The interface of container-job platforms (HF Jobs; Modal and a Docker engine to follow):
a small Protocol beside ``HostBackend`` and the frozen values it passes around.

A job has no SSH and no disk that lasts: the job *is* the run. It is submitted with an image
and a command (``traind run``), inspected, its stdout read as logs, and cancelled; the
platform's own listing, filtered by our label, says whether anything is left running.
Constructing an adapter does no I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from traind.launch.base import Handle

LABEL = "traind-launch"
"""The label every job of a launch carries, its value the launch's name."""


class JobState(StrEnum):
    """A job's state, normalised across platforms; the last five say why it ended."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    GONE = "gone"

    @property
    def ended(self) -> bool:
        """Whether the job will not run any further."""
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True)
class JobSpec:
    """What to run: ``secrets`` reach the job as the platform's secrets, never as plain
    environment; ``timeout`` in seconds; ``flavor`` the platform's name for the hardware."""

    image: str
    command: tuple[str, ...]
    label: str
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    flavor: str = ""
    timeout: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobStatus:
    """What a platform knows about a job right now; ``message`` is its own words."""

    state: JobState
    message: str = ""
    flavor: str = ""
    url: str = ""
    running_seconds: float | None = None


class JobBackend(Protocol):
    """A platform that runs container jobs. Every call raises a LaunchError subclass."""

    name: str

    async def submit(self, spec: JobSpec) -> Handle:
        """Start a job; ProvisionError when the platform refuses it (naming why)."""
        ...

    async def inspect(self, handle: Handle) -> JobStatus:
        """The job's normalised state; a job that is gone is GONE, not an error."""
        ...

    def logs(self, handle: Handle, follow: bool, tail: int | None = None) -> AsyncIterator[str]:
        """The job's stdout lines: what is there (the last ``tail``), then, with ``follow``,
        every new one until the job ends."""
        ...

    async def cancel(self, handle: Handle) -> None:
        """Stop the job. Idempotent: one that ended already is not an error."""
        ...

    async def running(self, label: str) -> list[str]:
        """The ids of this launch's jobs the platform still schedules or runs."""
        ...

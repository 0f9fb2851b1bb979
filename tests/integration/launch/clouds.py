"""One harness per cloud stand-in, so every failure test and the life cycle run the same way
against RunPod, Lambda and Nebius: start the stand-in with its instances reaching a loopback
host, build the adapter or its launch.toml table, and switch the provider's failures on."""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tests.support.fake_cloud import LoopbackHost, Serving
from tests.support.fake_lambda import API_KEY as LAMBDA_KEY
from tests.support.fake_lambda import FakeLambda
from tests.support.fake_nebius import TOKEN as NEBIUS_TOKEN
from tests.support.fake_nebius import FakeNebius
from tests.support.fake_runpod import API_KEY as RUNPOD_KEY
from tests.support.fake_runpod import FakeRunPod

CLOUDS = ["runpod", "lambda", "nebius"]
"""The stand-ins the shared tests run against."""
FAST = {"poll_interval": 0.05, "retries": 3, "backoff_initial": 0.05, "backoff_max": 0.2,
        "request_timeout": 10, "teardown_timeout": 10}
"""Timeouts shrunk for tests (the defaults are minutes)."""


class Cloud(Protocol):
    """A running stand-in and what the tests ask of it."""

    name: str
    host: LoopbackHost
    env: dict[str, str]
    quota_words: str

    def table(self) -> dict[str, Any]:
        """The launch.toml table of this backend, pointed at the stand-in."""

    def refuse_quota(self) -> None:
        """Make the next create fail on the account's quota."""

    def never_running(self) -> None:
        """Keep instances from ever running."""

    def rate_limit(self) -> None:
        """Make the provider rate-limit the next requests."""

    def rate_limited(self) -> int:
        """How many requests the provider refused for the rate limit."""

    def live(self) -> list[str]:
        """Instances that exist and are billed."""

    def created(self) -> int:
        """How many instances were ever created."""


def toml_value(value: Any) -> str:
    """A TOML literal for a str, number, bool or list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


def backend_toml(cloud: Cloud, ssh_key: Path, wait_running: str = "20s") -> str:
    """``backend = ...``, its table and ``[host]`` for a project's launch.toml."""
    table = "\n".join(f"{k} = {toml_value(v)}" for k, v in cloud.table().items())
    return (f'backend = "{cloud.name}"\n\n[{cloud.name}]\n{table}\n\n[host]\n'
            f'ssh_key = "{ssh_key}"\nwait_running = "{wait_running}"\nimage = "img:1"\n'
            f"disk_gb = 64\n")


@dataclass
class RunPodCloud:
    """The RunPod REST v2 stand-in."""

    fake: FakeRunPod
    url: str
    name: str = "runpod"
    quota_words: str = "Insufficient balance"
    env: dict[str, str] = field(default_factory=lambda: {"RUNPOD_API_KEY": RUNPOD_KEY})

    @property
    def host(self) -> LoopbackHost:
        return self.fake.host

    def table(self) -> dict[str, Any]:
        return {"url": self.url, "ssh_user": getpass.getuser(), **FAST}

    def refuse_quota(self) -> None:
        self.fake.refuse_create = (402, "Insufficient balance to deploy this pod.")

    def never_running(self) -> None:
        self.fake.never_running = True

    def rate_limit(self) -> None:
        self.fake.rate_limited = 2

    def rate_limited(self) -> int:
        return len(self.fake.throttled)

    def live(self) -> list[str]:
        return list(self.fake.pods)

    def created(self) -> int:
        return len(self.fake.pods) + len(self.fake.deleted)


@dataclass
class LambdaCloud:
    """The Lambda Cloud REST v1 stand-in, with its rate limits scaled down."""

    fake: FakeLambda
    url: str
    name: str = "lambda"
    quota_words: str = "Quota exceeded"
    env: dict[str, str] = field(default_factory=lambda: {"LAMBDA_API_KEY": LAMBDA_KEY})
    pace: tuple[float, float] = (0.04, 0.2)
    """The adapter's request and launch intervals: the stand-in's limits, with a margin."""

    @property
    def host(self) -> LoopbackHost:
        return self.fake.host

    def table(self) -> dict[str, Any]:
        return {"url": self.url, "ssh_user": getpass.getuser(), "ssh_port": self.host.port,
                "request_interval": self.pace[0], "launch_interval": self.pace[1], **FAST}

    def refuse_quota(self) -> None:
        self.fake.refuse_launch = ("global/quota-exceeded", "Quota exceeded.")

    def never_running(self) -> None:
        self.fake.never_active = True

    def rate_limit(self) -> None:
        self.fake.request_interval = 0.3

    def rate_limited(self) -> int:
        return len(self.fake.throttled)

    def live(self) -> list[str]:
        return self.fake.live()

    def created(self) -> int:
        return len(self.fake.instances)


@dataclass
class NebiusCloud:
    """The Nebius gRPC stand-in, reached through the official SDK."""

    fake: FakeNebius
    name: str = "nebius"
    quota_words: str = "Quota limit exceeded"
    env: dict[str, str] = field(default_factory=lambda: {"NEBIUS_IAM_TOKEN": NEBIUS_TOKEN})

    @property
    def host(self) -> LoopbackHost:
        return self.fake.host

    def table(self) -> dict[str, Any]:
        return {"endpoint": self.fake.address, "tls": False, "project_id": self.fake.project,
                "subnet_id": "vpcsubnet-e00test", "ssh_user": getpass.getuser(),
                "ssh_port": self.host.port, **FAST}

    def refuse_quota(self) -> None:
        self.fake.quota_exceeded = True

    def never_running(self) -> None:
        self.fake.never_running = True

    def rate_limit(self) -> None:
        self.fake.rate_limited = 2

    def rate_limited(self) -> int:
        return len(self.fake.throttled)

    def live(self) -> list[str]:
        return self.fake.live()

    def created(self) -> int:
        return len(self.fake.created)


@contextlib.asynccontextmanager
async def running(name: str, host: LoopbackHost) -> AsyncIterator[Cloud]:
    """The stand-in of ``name`` served on loopback for the block, its instances at ``host``."""
    if name == "runpod":
        runpod = FakeRunPod(host=host)
        async with Serving(runpod.app()) as url:
            yield RunPodCloud(runpod, url)
    elif name == "lambda":
        lam = FakeLambda(host=host, request_interval=0.02, launch_interval=0.1)
        async with Serving(lam.app()) as url:
            yield LambdaCloud(lam, url)
    elif name == "nebius":
        nebius = FakeNebius(host=host)
        await nebius.start()
        try:
            yield NebiusCloud(nebius)
        finally:
            await nebius.stop()
    else:
        raise AssertionError(f"no stand-in for {name}")

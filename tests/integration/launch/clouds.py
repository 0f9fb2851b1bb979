"""One harness per cloud stand-in, so every failure test and the life cycle run the same way
against RunPod, Lambda and Nebius: start the stand-in with its instances reaching a loopback
host, build the adapter or its launch.toml table, and switch the provider's failures on."""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass
class Cloud:
    """A running stand-in and what the tests ask of it: its launch.toml table, its
    credentials' environment, its failure switches and what it has billed."""

    name: str
    fake: Any
    env: dict[str, str]
    quota_words: str
    """Words of the provider's own quota message."""
    values: Callable[[], dict[str, Any]]
    refuse_quota: Callable[[], None]
    never_running: Callable[[], None]
    rate_limit: Callable[[], None]

    @property
    def host(self) -> LoopbackHost:
        """Where its instances' SSH answers."""
        host: LoopbackHost = self.fake.host
        return host

    def table(self) -> dict[str, Any]:
        """The launch.toml table of this backend, pointed at the stand-in."""
        return {"ssh_user": getpass.getuser(), **FAST, **self.values()}

    def rate_limited(self) -> int:
        """How many requests the provider refused for its rate limit."""
        return len(self.fake.throttled)

    def live(self) -> list[str]:
        """Instances that exist and are billed."""
        live: list[str] = self.fake.live()
        return live

    def created(self) -> int:
        """How many instances were ever created."""
        count: int = self.fake.ever_created()
        return count


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


def setattrs(target: Any, **values: Any) -> Callable[[], None]:
    """A switch that sets ``values`` on ``target``."""

    def switch() -> None:
        for name, value in values.items():
            setattr(target, name, value)

    return switch


@contextlib.asynccontextmanager
async def running(name: str, host: LoopbackHost) -> AsyncIterator[Cloud]:
    """The stand-in of ``name`` served on loopback for the block, its instances at ``host``."""
    if name == "runpod":
        runpod = FakeRunPod(host=host)
        async with Serving(runpod.app()) as url:
            yield Cloud(
                "runpod", runpod, {"RUNPOD_API_KEY": RUNPOD_KEY}, "Insufficient balance",
                lambda: {"url": url},
                setattrs(runpod, refuse_create=(402, "Insufficient balance to deploy a pod.")),
                setattrs(runpod, never_running=True), setattrs(runpod, rate_limited=2),
            )
    elif name == "lambda":
        # The adapter is paced at twice the stand-in's (scaled-down) limits; rate_limit
        # tightens the stand-in's behind the adapter's back.
        lam = FakeLambda(host=host, request_interval=0.02, launch_interval=0.1)
        async with Serving(lam.app()) as url:
            yield Cloud(
                "lambda", lam, {"LAMBDA_API_KEY": LAMBDA_KEY}, "Quota exceeded",
                lambda: {"url": url, "ssh_port": host.port, "request_interval": 0.04,
                         "launch_interval": 0.2},
                setattrs(lam, refuse_launch=("global/quota-exceeded", "Quota exceeded.")),
                setattrs(lam, never_active=True), setattrs(lam, request_interval=0.3),
            )
    elif name == "nebius":
        nebius = FakeNebius(host=host)
        await nebius.start()
        try:
            yield Cloud(
                "nebius", nebius, {"NEBIUS_IAM_TOKEN": NEBIUS_TOKEN}, "Quota limit exceeded",
                lambda: {"endpoint": nebius.address, "tls": False, "project_id": nebius.project,
                         "subnet_id": "vpcsubnet-e00test", "ssh_port": host.port},
                setattrs(nebius, quota_exceeded=True), setattrs(nebius, never_running=True),
                setattrs(nebius, rate_limited=2),
            )
        finally:
            await nebius.stop()
    else:
        raise AssertionError(f"no stand-in for {name}")

"""A real Docker Engine and a registry-free base image, shared by a session's docker tests."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.dockerd import Dockerd, import_rootfs, running_dockerd
from tests.support.rootfs import python_rootfs

BASE_IMAGE = "traind-base:test"


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """A private dockerd for the session (root only), stopped and removed at its end."""
    with running_dockerd() as engine:
        yield engine


@pytest.fixture(scope="session")
def base_image(dockerd: Dockerd, tmp_path_factory: pytest.TempPathFactory) -> str:
    """This machine's Python with traind's dependencies (and the libraries torch links
    against, for a virtualenv mounted in), imported into the engine once per session."""
    tarball = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    torch = importlib.util.find_spec("torch")
    extra = []
    if torch is not None and torch.origin is not None:
        extra = sorted((Path(torch.origin).parent / "lib").glob("*.so*"))
    python = python_rootfs(tarball, extra)
    path = f"{python.parent}:/usr/local/bin:/usr/bin:/bin"
    asyncio.run(asyncio.wait_for(import_rootfs(dockerd.host, tarball, BASE_IMAGE, path), 120))
    return BASE_IMAGE

"""SSH store errors carry their facts (SFTP status, errno, the operation), set where asyncssh's
errors are translated, against a real sshd."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.integration.ssh.conftest import ssh_config
from tests.support.requires import need_module
from tests.support.sshd import SSHServer

from traind.errors import StorageError


async def test_no_such_file_carries_its_sftp_status(sshd: SSHServer, remote: Path) -> None:
    """A remote file that is not there fails with code FX_NO_SUCH_FILE (``missing``), not
    transient, naming the operation."""
    need_module("asyncssh")
    from traind.storage.ssh.link import SSHLink

    link = SSHLink(ssh_config(sshd, remote))
    try:
        path = str(remote / "nope.bin")
        async with asyncio.timeout(30):
            with pytest.raises(StorageError) as caught:
                await link.call(f"stat {path}", lambda sftp: sftp.stat(path))
        error = caught.value
        assert (error.code, error.missing, error.transient) == ("FX_NO_SUCH_FILE", True, False)
        assert error.op == f"stat {path}"
        assert "No such file" in str(error)
    finally:
        async with asyncio.timeout(10):
            await link.aclose()


async def test_a_missing_object_read_by_range_is_missing(
    sshd: SSHServer, make_store: Callable[..., Any], remote: Path
) -> None:
    """The store's ranged read of a key that is not there fails as missing, naming the
    remote path it read; whole reads and stats of it are None instead."""
    objects = make_store(sshd)
    async with asyncio.timeout(30):
        with pytest.raises(StorageError) as caught:
            await objects.get_range("checkpoint-1/nope.bin", 0, 10)
        assert await objects.get("checkpoint-1/nope.bin") is None
        assert await objects.head("checkpoint-1/nope.bin") is None
    error = caught.value
    assert (error.code, error.missing, error.transient) == ("FX_NO_SUCH_FILE", True, False)
    assert error.op == f"read {remote / 'store/run1/checkpoint-1/nope.bin'}"

"""The ``[storage]`` body of a fresh store of each kind, with a real server behind it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.requires import need_binary, need_module
from tests.support.seaweed import running_seaweed
from tests.support.sshd import HOST, SSHServer


@contextmanager
def store_section(kind: str, tmp_path: Path) -> Iterator[str]:
    """The [storage] body of a fresh ``kind`` store: ``local``, ``s3`` (a real SeaweedFS) or
    ``ssh`` / ``ssh-<transfer>`` (a real sshd); its server is stopped on exit."""
    if kind == "local":
        yield f'type = "local"\npath = "{tmp_path / "store"}"\n'
        return
    if kind == "s3":
        need_module("aiobotocore")
        with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
            server.create_bucket("ckpts")
            yield server.storage_toml()
        return
    need_module("asyncssh")
    server = SSHServer(need_binary("sshd"), tmp_path / "sshd")
    server.start_sync()
    transfer = kind.removeprefix("ssh").removeprefix("-")
    try:
        yield (
            f'type = "ssh"\nhost = "{HOST}"\nport = {server.port}\nuser = "{server.user}"\n'
            f'identity_file = "{server.user_key.path}"\nknown_hosts = "{server.known_hosts}"\n'
            f'remote_path = "{tmp_path / "remote"}"\n'
            + (f'transfer = "{transfer}"\n' if transfer else "")
        )
    finally:
        server.stop_sync()

"""Fixtures for the SSH store tests: a real OpenSSH sshd per test, and stores aimed at it —
``make_store`` the SSH store's primitives (``SSHStore``), ``make_backend`` the checkpoint
protocol over one (``CheckpointStore``: claims, commits, manifests).

Everything a test writes "remotely" lands under ``tmp_path/remote`` (sshd serves the same
machine), so tests can look at the bytes on the remote side directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest
from tests.support.checkpoints import run_in
from tests.support.requires import need_binary, need_module
from tests.support.sshd import HOST, SSHServer

from traind.checkpoints.state.journal import Journal, JournalSession
from traind.config import SSHStorage
from traind.errors import StorageError
from traind.layout.manifest import FileEntry, Manifest, Writer
from traind.protocol import CheckpointStore, open_storage
from traind.storage import LocalFile

if TYPE_CHECKING:
    from traind.storage.ssh.store import SSHStore

StartSSHD = Callable[..., SSHServer]
class _Closable(Protocol):
    async def aclose(self) -> None: ...


T = TypeVar("T", bound=_Closable)
MakeStore = Callable[..., "SSHStore"]
MakeBackend = Callable[..., CheckpointStore]
TRANSFER_TOOLS = {"openssh": ("ssh",), "rsync": ("rsync", "ssh")}
"""Executables each transfer mode runs on this side."""


@pytest.fixture
def start_sshd(tmp_path: Path) -> Iterator[StartSSHD]:
    """Start sshd servers (options as for SSHServer); every one is stopped at teardown."""
    binary = need_binary("sshd")
    need_binary("ssh-keygen")
    servers: list[SSHServer] = []

    def start(**options: Any) -> SSHServer:
        server = SSHServer(binary, tmp_path / f"sshd-{len(servers)}", **options)
        servers.append(server)
        server.start_sync()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop_sync()


@pytest.fixture
def sshd(start_sshd: StartSSHD) -> SSHServer:
    """One running sshd that logs every SFTP operation (``sshd.sftp_operations()``)."""
    return start_sshd(sftp_log=True)


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """The directory the remote side writes into; the store is ``remote/store``."""
    path = tmp_path / "remote"
    path.mkdir()
    return path


def ssh_config(server: SSHServer, remote: Path, **overrides: Any) -> SSHStorage:
    """An SSHStorage for ``server`` with short timeouts and fast retries (for tests)."""
    fields: dict[str, Any] = {
        "type": "ssh", "host": HOST, "port": server.port, "user": server.user,
        "identity_file": server.user_key.path, "known_hosts": server.known_hosts,
        "remote_path": str(remote / "store"), "connect_timeout": 5, "keepalive": 5,
        "retries": 3, "backoff_initial": 0.05, "backoff_max": 0.5,
    }
    return SSHStorage.model_validate({**fields, **overrides})


def _need_tools(overrides: dict[str, Any]) -> None:
    """Skip the test when the transfer mode of ``overrides`` needs a tool that is missing."""
    need_module("asyncssh")
    for tool in TRANSFER_TOOLS.get(overrides.get("transfer", "sftp"), ()):
        need_binary(tool)


@pytest.fixture
async def make_store(remote: Path) -> AsyncIterator[MakeStore]:
    """Build SSH stores for a server (config overrides as keywords; skipped when the
    transfer mode's tools are missing); closed at teardown."""
    need_module("asyncssh")
    from traind.storage.ssh.store import SSHStore

    async with _closing(remote, SSHStore) as make:
        yield make


@pytest.fixture
async def make_backend(remote: Path) -> AsyncIterator[MakeBackend]:
    """Build checkpoint stores (the protocol over an SSH store, as the daemon opens them)
    for a server, as ``make_store`` does; closed at teardown."""
    need_module("asyncssh")
    async with _closing(remote, open_storage) as make:
        yield make


@contextlib.asynccontextmanager
async def _closing(remote: Path, build: Callable[[SSHStorage, str], T]
                   ) -> AsyncIterator[Callable[..., T]]:
    """A maker of ``build(config, run)`` for a server and overrides; each one made is closed
    on exit."""
    made: list[T] = []

    def make(server: SSHServer, run: str = "run1", **overrides: Any) -> T:
        _need_tools(overrides)
        made.append(build(ssh_config(server, remote, **overrides), run))
        return made[-1]

    yield make
    async with asyncio.timeout(10):
        for one in made:
            await one.aclose()


@pytest.fixture
def openssh_error(remote: Path) -> Callable[..., Awaitable[StorageError]]:
    """``await openssh_error(server, **overrides)``: the error the openssh mode's own ssh
    connection fails with (no asyncssh connection before it), config as ``ssh_config``."""
    need_binary("ssh")
    need_module("asyncssh")
    from traind.storage.ssh.link import SSHLink
    from traind.storage.ssh.openssh.transfer import OpenSSHTransfer

    async def probe(server: SSHServer, **overrides: Any) -> StorageError:
        config = ssh_config(server, remote, transfer="openssh", retries=0, **overrides)
        transfer = OpenSSHTransfer(SSHLink(config), "test")
        try:
            async with asyncio.timeout(20):
                with pytest.raises(StorageError) as caught:
                    await transfer.probe()
        finally:
            await asyncio.wait_for(transfer.aclose(), 10)
        return caught.value

    return probe


@pytest.fixture
def checkpoint(tmp_path: Path) -> Callable[[str, dict[str, bytes]], tuple[Path, list[LocalFile]]]:
    """Write a checkpoint directory from ``{relative path: content}``; return (root, files)."""

    def write(tag: str, contents: dict[str, bytes]) -> tuple[Path, list[LocalFile]]:
        root = tmp_path / "staging" / tag
        for rel, data in contents.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        return root, [LocalFile(rel, len(data)) for rel, data in sorted(contents.items())]

    return write


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    """The real journal, in a temporary state directory."""
    j = Journal(tmp_path / "state" / "journal.db", run_in(tmp_path))
    try:
        yield j
    finally:
        j.close()


Store = Callable[..., Awaitable[Manifest]]


@pytest.fixture
def store(journal: Journal) -> Store:
    """``await store(backend, tag, root, files, session=None)`` does what the streamer does
    (through the checkpoint protocol): journal the files, upload those not stored yet,
    commit the manifest."""

    async def run(
        backend: CheckpointStore, tag: str, root: Path, files: list[LocalFile],
        session: JournalSession | None = None,
    ) -> Manifest:
        if await journal.get(tag) is None:
            await journal.staged(tag, 1, root, files)
        await journal.begin_upload(tag, backend.describe)
        pending = {f.path for f in await journal.files(tag) if f.sha256 is None}
        todo = [f for f in files if f.path in pending]
        if todo:
            await backend.upload(tag, root, todo, session or JournalSession(journal, tag, _no_op))
        stored = await journal.files(tag)
        assert all(f.sha256 for f in stored), "backend did not report every file as done"
        manifest = Manifest(
            run="run1", tag=tag, step=1,
            files=tuple(FileEntry(f.path, f.size, f.sha256 or "") for f in stored),
            writer=Writer("a" * 32, "h"),
        )
        await backend.commit(manifest)
        await journal.set_state(tag, "committed")
        return manifest

    return run


def _no_op(nbytes: int) -> None:
    return None

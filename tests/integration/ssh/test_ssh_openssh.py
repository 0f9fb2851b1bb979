"""The openssh mode's ssh processes: shared by small files, never left behind, errors explained."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.net import free_port
from tests.support.procfs import autogroup_nice, autogroups, nice_of
from tests.support.sshd import SSHServer, descendants, keygen

from traind.checkpoints.state.journal import Journal, JournalSession
from traind.errors import TransientStorageError
from traind.layout.manifest import Manifest
from traind.storage import LocalFile

Checkpoint = Callable[[str, dict[str, bytes]], tuple[Path, list[LocalFile]]]
Store = Callable[..., Awaitable[Manifest]]
MiB = 1024 * 1024


def _our_ssh_processes() -> list[int]:
    """ssh processes this test process started that still exist (zombies included)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ssh":
                found.append(pid)
        except OSError:
            continue
    return found


def _sparse(root: Path, name: str, size: int) -> LocalFile:
    """A file of ``size`` zero bytes that costs no disk time to write."""
    with open(root / name, "wb") as f:
        f.truncate(size)
    return LocalFile(name, size)


async def test_small_files_share_a_connection_large_ones_get_their_own(
    sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint, store: Store,
    tmp_path: Path,
) -> None:
    """Small files reuse one ssh (a new one costs more than they do), files of 64 MiB or more
    start their own up to ``concurrency``, later checkpoints reuse them, aclose stops all."""
    from traind.storage.ssh.openssh.transfer import WORTH_A_CONNECTION

    backend = make_backend(sshd, transfer="openssh", concurrency=4)
    small = {f"part-{i}.json": os.urandom(1000 + i) for i in range(6)}
    with capture_logs() as logs:
        async with asyncio.timeout(60):
            await store(backend, "checkpoint-1", *checkpoint("checkpoint-1", small))
            assert len([e for e in logs if e["event"] == "ssh_openssh_connected"]) == 1

            root, files = checkpoint("checkpoint-2", small)
            files += [_sparse(root, f"shard-{i}.bin", WORTH_A_CONNECTION) for i in range(2)]
            await store(backend, "checkpoint-2", root, files)
    connected = [e for e in logs if e["event"] == "ssh_openssh_connected"]
    assert 2 <= len(connected) <= 3  # the idle one, plus one per shard it was not free for
    assert len(_our_ssh_processes()) == len(connected)
    async with asyncio.timeout(20):
        await backend.aclose()
    assert _our_ssh_processes() == []


async def test_the_first_metadata_call_starts_the_ssh_the_upload_takes(
    sshd: SSHServer, make_store: Callable[..., Any], journal: Journal, tmp_path: Path,
) -> None:
    """The store's first SFTP call starts one ssh in the background; the upload after it
    takes that one rather than starting another; one never taken is stopped by aclose."""
    objects = make_store(sshd, transfer="openssh")
    root = tmp_path / "staging"
    root.mkdir()
    (root / "a.json").write_bytes(b"{}")
    files = [LocalFile("a.json", 2)]
    await journal.staged("checkpoint-1", 1, root, files)
    with capture_logs() as logs:
        async with asyncio.timeout(60):
            assert await objects.head("checkpoint-1/a.json") is None
            assert len(_our_ssh_processes()) == 1  # started alongside, not waited for
            session = JournalSession(journal, "checkpoint-1", lambda nbytes: None)
            await objects.send("checkpoint-1/", root, files, session)
    assert len([e for e in logs if e["event"] == "ssh_openssh_connected"]) == 1
    async with asyncio.timeout(20):
        await objects.aclose()
    assert _our_ssh_processes() == []

    unused = make_store(sshd, transfer="openssh")
    async with asyncio.timeout(60):
        await unused.list_dirs()
        assert len(_our_ssh_processes()) == 1
        await unused.aclose()
    assert _our_ssh_processes() == []


async def test_a_cancelled_upload_stops_its_ssh(
    sshd: SSHServer, make_store: Callable[..., Any], journal: Journal, remote: Path,
    tmp_path: Path,
) -> None:
    """Cancelling an upload mid-file stops and reaps its ssh at once; nothing is published,
    and the thread's error (its pipe cut) is not left for asyncio to log."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    objects = make_store(sshd, transfer="openssh")
    root = tmp_path / "staging"
    root.mkdir()
    files = [_sparse(root, "big.bin", 512 * MiB)]
    await journal.staged("checkpoint-1", 1, root, files)
    moving = asyncio.Event()

    def moved(nbytes: int) -> None:  # called in the transfer's thread
        loop.call_soon_threadsafe(moving.set)

    session = JournalSession(journal, "checkpoint-1", moved)
    upload = asyncio.create_task(objects.send("checkpoint-1/", root, files, session))
    async with asyncio.timeout(30):
        await moving.wait()
        assert _our_ssh_processes()
        upload.cancel()
        with pytest.raises(asyncio.CancelledError):
            await upload
    assert _our_ssh_processes() == []
    assert not (remote / "store" / "run1" / "checkpoint-1" / "big.bin").exists()
    assert all(f.sha256 is None for f in await journal.files("checkpoint-1"))
    await objects.aclose()
    del upload, objects
    gc.collect()
    assert [c["message"] for c in unhandled] == []


@pytest.mark.parametrize(
    ("case", "expected", "transient"),
    [
        ("auth", "authentication failed: the server accepted none of the offered keys", False),
        ("refused", "connection refused: nothing listens on port", True),
        ("dns", "cannot resolve host name 'no-such-host.invalid' (DNS)", True),
    ],
)
async def test_ssh_failures_read_like_the_sftp_modes(
    case: str, expected: str, transient: bool, sshd: SSHServer,
    openssh_error: Callable[..., Any], tmp_path: Path,
) -> None:
    """What ssh prints when it fails becomes the SFTP mode's error, retried only if it may pass."""
    options: dict[str, dict[str, Any]] = {
        "auth": {"identity_file": keygen(tmp_path / "stranger").path},
        "refused": {"port": free_port()},
        "dns": {"host": "no-such-host.invalid"},
    }
    error = await openssh_error(sshd, **options[case])
    assert expected in str(error)
    assert isinstance(error, TransientStorageError) == transient


async def test_ssh_runs_at_the_transfer_priority(
    sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint, store: Store,
) -> None:
    """With transfers lowered (``traind run`` does it), each ssh carrying checkpoint bytes
    runs at the transfer nice value, below this process."""
    from traind.util.proc import priority

    if not priority.per_thread():
        pytest.skip("per-thread nice is Linux's")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    priority.lower_transfers(4)
    try:
        backend = make_backend(sshd, transfer="openssh")
        async with asyncio.timeout(60):
            await store(backend, "checkpoint-1", *checkpoint("checkpoint-1", {"a.bin": b"x"}))
        ssh = _our_ssh_processes()
        assert ssh
        assert {nice_of(pid) for pid in ssh} == {min(19, base + 4)}
        if autogroups():  # each ssh leads a session of its own
            assert {autogroup_nice(pid) for pid in ssh} == {min(19, base + 4)}
    finally:
        priority.lower_transfers(0)

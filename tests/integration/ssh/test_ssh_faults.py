"""Faults: sshd dies mid-upload and comes back; probe says precisely what is wrong."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.net import free_port
from tests.support.sshd import SSHServer, keygen

from traind.checkpoints.state.journal import Journal, JournalSession
from traind.errors import StorageError, TransientStorageError
from traind.layout.keys import MANIFEST_NAME
from traind.layout.manifest import Manifest, verify
from traind.storage import LocalFile

Checkpoint = Callable[[str, dict[str, bytes]], tuple[Path, list[LocalFile]]]
Store = Callable[..., Awaitable[Manifest]]

MiB = 1024 * 1024
FILES = {
    "a-config.json": b'{"step": 1}',
    "b-small.bin": os.urandom(2 * MiB),
    "c-large.bin": os.urandom(32 * MiB),
    "d-after.bin": os.urandom(1 * MiB),
}


class CountingSession(JournalSession):
    """The real journal session, counting file_done calls and bytes moved."""

    def __init__(self, journal: Journal, tag: str) -> None:
        super().__init__(journal, tag, self._advance)
        self.done: list[str] = []
        self.moved = 0
        self.on_bytes: Callable[[int], None] = lambda total: None

    def _advance(self, nbytes: int) -> None:
        self.moved += nbytes
        self.on_bytes(self.moved)

    async def file_done(self, path: str, sha256: str) -> None:
        self.done.append(path)
        await super().file_done(path, sha256)


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
async def test_sshd_restart_mid_upload_commits_once(
    transfer: str, sshd: SSHServer, make_backend: Callable[..., Any], checkpoint: Checkpoint,
    journal: Journal, store: Store, remote: Path, tmp_path: Path,
) -> None:
    """sshd killed in the middle of a file and restarted: the upload resumes, finished files
    are not sent again, and the checkpoint is committed exactly once."""
    backend = make_backend(sshd, transfer=transfer, concurrency=1, retries=12,
                           backoff_initial=0.05, backoff_max=0.4)
    tag, tag_dir = "checkpoint-9", remote / "store" / "run1" / "checkpoint-9"
    root, files = checkpoint(tag, FILES)
    session = CountingSession(journal, tag)
    loop = asyncio.get_running_loop()
    killed = threading.Event()
    stored_before_kill: dict[str, int] = {}  # name -> inode
    restarting: list[asyncio.Task[None]] = []

    async def restart() -> None:
        await asyncio.sleep(0.3)  # long enough for reconnects to be refused
        await sshd.start()

    def kill_now() -> None:
        # Called on the loop (sftp, rsync) or in the transfer's thread (openssh): either way
        # no byte moves until the kill is done.
        if not killed.is_set():
            killed.set()
            sshd.stop_sync()
            stored_before_kill.update(
                {p.name: p.stat().st_ino for p in tag_dir.iterdir() if p.name in FILES})
            loop.call_soon_threadsafe(lambda: restarting.append(loop.create_task(restart())))

    if transfer != "rsync":
        # Kill once 4 MiB of the large file are written (files go one at a time, in order).
        before_large = len(FILES["a-config.json"]) + len(FILES["b-small.bin"])

        def on_bytes(total: int) -> None:
            if total > before_large + 4 * MiB:
                kill_now()

        session.on_bytes = on_bytes
        watcher = None
    else:  # rsync reports nothing while it runs: watch its temporary file grow instead
        watcher = asyncio.create_task(_kill_when_growing(tag_dir, "c-large.bin", kill_now))

    with capture_logs() as logs:
        async with asyncio.timeout(60):
            manifest = await store(backend, tag, root, files, session)
            if watcher:
                await watcher
            await asyncio.gather(*restarting)
    assert killed.is_set(), "sshd was never killed: the test did not test anything"
    retries = [e for e in logs if e["event"] == "ssh_retry"]
    assert retries, "the upload never saw the connection drop"
    assert sorted(session.done) == sorted(FILES)  # every file reported exactly once
    assert sorted(stored_before_kill) == ["a-config.json", "b-small.bin"]
    for name, inode in stored_before_kill.items():  # and those were not written again
        assert (tag_dir / name).stat().st_ino == inode, f"{name} was re-sent"
    assert session.moved == sum(len(v) for v in FILES.values())  # progress rewound on retry

    manifest_renames = [op for op in sshd.sftp_operations()
                        if op.startswith(("posix-rename", "hardlink"))
                        and op.endswith(f'{MANIFEST_NAME}"')]
    assert len(manifest_renames) == 1
    assert [m.tag for m in await backend.manifests()] == [tag]
    entry = await journal.get(tag)
    assert entry is not None
    assert entry.state == "committed"
    async with asyncio.timeout(30):
        hashes = await backend.download(manifest, tmp_path / "restore", lambda n: None)
    verify(manifest, {p: ((tmp_path / "restore" / p).stat().st_size, h)
                      for p, h in hashes.items()})
    assert {p.name for p in tag_dir.iterdir()} == {*FILES, MANIFEST_NAME}  # no leftovers


async def _kill_when_growing(tag_dir: Path, name: str, kill: Callable[[], None]) -> None:
    """Call ``kill`` once rsync's temporary file for ``name`` holds more than 1 MiB."""
    while True:
        for p in tag_dir.glob(f".traind-rsync-tmp-*/{name}.*"):  # this run's scratch
            try:
                if p.stat().st_size > MiB:
                    kill()
                    return
            except FileNotFoundError:
                pass
        await asyncio.sleep(0.005)


async def test_upload_gives_up_as_transient_when_the_host_stays_down(
    sshd: SSHServer, make_store: Callable[..., Any], checkpoint: Checkpoint, journal: Journal,
) -> None:
    """After ``retries`` reconnects the error is transient, so the streamer retries later."""
    objects = make_store(sshd, retries=2, backoff_initial=0.01, backoff_max=0.02)
    root, files = checkpoint("checkpoint-3", {"a.bin": b"a"})
    await journal.staged("checkpoint-3", 3, root, files)
    await sshd.stop()
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            with pytest.raises(TransientStorageError, match="connection refused"):
                await objects.send("checkpoint-3/", root, files,
                                   JournalSession(journal, "checkpoint-3", lambda n: None))
    assert [e["attempt"] for e in logs if e["event"] == "ssh_retry"] == [1, 2]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("dns", "cannot resolve host name 'no-such-host.invalid' (DNS)"),
        ("refused", "connection refused: nothing listens on port"),
        ("auth", "authentication failed: the server accepted none of the offered keys"),
        ("no_identity", "does not exist"),
        ("read_only", "create remote_path"),
        ("not_a_directory", "exists and is not a directory"),
    ],
)
async def test_probe_says_what_fails(
    case: str, expected: str, start_sshd: Callable[..., SSHServer],
    make_store: Callable[..., Any], tmp_path: Path,
) -> None:
    """``probe`` (check-config) names the failing step: DNS, refused, auth, permissions."""
    server = start_sshd(read_only_sftp=case == "read_only")
    (tmp_path / "a-file").write_text("")
    options: dict[str, dict[str, Any]] = {
        "dns": {"host": "no-such-host.invalid"},
        "refused": {"port": free_port()},
        "auth": {"identity_file": keygen(tmp_path / "stranger").path},
        "no_identity": {"identity_file": tmp_path / "missing_key"},
        "read_only": {},
        "not_a_directory": {"remote_path": str(tmp_path / "a-file" / "store")},
    }
    objects = make_store(server, **options[case])
    async with asyncio.timeout(20):
        with pytest.raises(StorageError) as caught:
            await objects.probe()
    assert expected in str(caught.value)
    if case == "read_only":
        assert "permission denied" in str(caught.value)


async def test_an_rsync_that_never_answers_the_probe_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local rsync hanging on --version fails the probe in VERSION_WITHIN and is killed
    with its process group, not left running (it starts through traind.util.proc.child)."""
    from traind.storage.ssh import rsync

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "rsync.pid"
    fake = bin_dir / "rsync"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(rsync, "VERSION_WITHIN", 0.5)
    with pytest.raises(StorageError, match="rsync --version gave no answer"):
        async with asyncio.timeout(20):
            await rsync.probe(Any, Any)  # the local rsync is asked first: no link is used
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


@pytest.mark.parametrize("transfer", ["sftp", "openssh", "rsync"])
async def test_probe_passes_and_leaves_nothing_behind(
    transfer: str, sshd: SSHServer, make_store: Callable[..., Any], remote: Path
) -> None:
    """A successful probe creates remote_path and removes its probe files (rsync mode also
    checks rsync runs at both ends, openssh mode that ssh starts the SFTP subsystem), and
    finds the exclusive create exclusive, which ``capabilities`` then says without asking."""
    objects = make_store(sshd, transfer=transfer)
    async with asyncio.timeout(20):
        await objects.probe()
        before = len(sshd.sftp_operations())
        caps = await objects.capabilities()
    assert (caps.create, caps.update) == (True, False)
    assert caps.claim.startswith("exclusive create over SFTP")
    assert len(sshd.sftp_operations()) == before  # remembered from the probe
    assert [p.relative_to(remote).as_posix() for p in remote.rglob("*")] == [
        "store", "store/run1"]

"""The openssh mode's SFTP client against OpenSSH's real sftp-server, on plain pipes (no ssh)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.requires import missing
from tests.support.sshd import SFTP_SERVERS

from traind.errors import StorageError, TransientStorageError
from traind.storage.ssh.openssh.pipe import DEFAULT_REQUEST, SFTPPipe
from traind.storage.ssh.openssh.wire import ProtocolError
from traind.util import fileio

MiB = 1024 * 1024


class Servers:
    """sftp-server processes on plain pipes, each with the client end as an SFTPPipe."""

    def __init__(self, binary: str, cwd: Path) -> None:
        self.binary = binary
        self._cwd = cwd
        self.started: list[tuple[subprocess.Popen[bytes], SFTPPipe]] = []

    def start(self, *options: str, argv: list[str] | None = None) -> SFTPPipe:
        """Run sftp-server with ``options`` (or ``argv`` instead); return the client end."""
        child_in, ours_out = os.pipe()
        ours_in, child_out = os.pipe()
        proc = subprocess.Popen(argv or [self.binary, *options], stdin=child_in,
                                stdout=child_out, cwd=self._cwd, start_new_session=True)
        os.close(child_in)
        os.close(child_out)
        pipe = SFTPPipe(ours_out, ours_in, "test-server")
        self.started.append((proc, pipe))
        return pipe


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """Start sftp-servers on pipes; each is killed and its pipes closed at teardown."""
    binary = next((p for p in SFTP_SERVERS if Path(p).exists()), None)
    if binary is None:
        missing(f"no sftp-server in {SFTP_SERVERS}")
        return
    running = Servers(binary, tmp_path)
    yield running
    for proc, pipe in running.started:
        proc.kill()
        proc.wait(timeout=10)
        pipe.close()


@pytest.mark.parametrize(("options", "request_size"), [((), 261120), (("-P", "limits"),
                                                                     DEFAULT_REQUEST)])
@pytest.mark.parametrize("size", [0, 1, 5 * MiB + 17])
def test_put_then_get_round_trip(
    size: int, options: tuple[str, ...], request_size: int, servers: Servers,
    tmp_path: Path,
) -> None:
    """Bytes and sha256 survive up and down, in the server's request size (limits@openssh.com,
    else 32 KiB); the file appears only under its final name."""
    data = os.urandom(size)
    (tmp_path / "local.bin").write_bytes(data)
    (tmp_path / "store").mkdir()
    pipe = servers.start(*options)
    assert pipe.handshake().write == request_size
    moved: list[int] = []
    remote = str(tmp_path / "store" / "remote.bin")
    assert pipe.put(tmp_path / "local.bin", remote, remote + ".traind-part", moved.append) == (
        size, hashlib.sha256(data).hexdigest())
    assert os.listdir(tmp_path / "store") == ["remote.bin"]
    assert (tmp_path / "store" / "remote.bin").read_bytes() == data
    assert sum(moved) == size
    assert all(n <= request_size for n in moved)

    back = tmp_path / "back" / "nested" / "remote.bin"
    assert pipe.get(remote, back, size, moved.append) == (size, hashlib.sha256(data).hexdigest())
    assert back.read_bytes() == data
    assert sum(moved) == 2 * size


def test_remote_refusals_are_clear_errors(servers: Servers, tmp_path: Path) -> None:
    """A refused write and a missing remote file fail with what and where, not retried."""
    (tmp_path / "local.bin").write_bytes(b"x")
    pipe = servers.start("-P", "write")
    pipe.handshake()
    with pytest.raises(StorageError, match=r"test-server: write local\.bin: permission denied "
                                           "on the remote host") as refused:
        pipe.put(tmp_path / "local.bin", str(tmp_path / "remote.bin"),
                 str(tmp_path / "remote.bin.traind-part"), lambda n: None)
    assert not isinstance(refused.value, TransientStorageError)
    with pytest.raises(StorageError, match=r"open .*/nope\.bin: remote error: No such file"):
        pipe.get(str(tmp_path / "nope.bin"), tmp_path / "back.bin", 1, lambda n: None)


def test_a_missing_local_file_is_not_retried(servers: Servers, tmp_path: Path) -> None:
    """A local file that cannot be read is a permanent error naming it."""
    pipe = servers.start()
    pipe.handshake()
    with pytest.raises(StorageError, match=r"cannot read .*gone\.bin") as caught:
        pipe.put(tmp_path / "gone.bin", str(tmp_path / "remote.bin"),
                 str(tmp_path / "remote.bin.traind-part"), lambda n: None)
    assert not isinstance(caught.value, TransientStorageError)


def test_a_server_without_fsync_and_posix_rename_is_refused(servers: Servers) -> None:
    """Durable, atomic files need both extensions; their absence is said up front."""
    pipe = servers.start("-P", "fsync,posix-rename")
    with pytest.raises(StorageError, match=r"test-server: the SFTP server does not offer "
                                           r"fsync@openssh.com, posix-rename@openssh.com"):
        pipe.handshake()


def test_a_login_banner_on_stdout_is_a_protocol_error(servers: Servers) -> None:
    """A remote shell printing at login garbles the stream: refused, never misread."""
    pipe = servers.start(argv=["sh", "-c", "echo 'Welcome to storage!'; cat >/dev/null"])
    with pytest.raises(ProtocolError):
        pipe.handshake()


def test_a_server_that_dies_mid_upload_is_a_lost_connection(
    servers: Servers, tmp_path: Path
) -> None:
    """The server going away mid-file is transient (retried), and leaves no final file."""
    (tmp_path / "local.bin").write_bytes(os.urandom(16 * MiB))
    pipe = servers.start()
    pipe.handshake()
    server = servers.started[-1][0]

    def kill_once_moving(n: int) -> None:
        server.kill()

    with pytest.raises(TransientStorageError, match="connection lost"):
        pipe.put(tmp_path / "local.bin", str(tmp_path / "remote.bin"),
                 str(tmp_path / "remote.bin.traind-part"), kill_once_moving)
    assert not (tmp_path / "remote.bin").exists()


SWAP_REPLIES = """
import struct, subprocess, sys
server = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
src, out, seen, held = server.stdout, sys.stdout.buffer, 0, None
while len(head := src.read(4)) == 4:
    packet = head + src.read(struct.unpack(">I", head)[0])
    if packet[4] == 103:  # SSH_FXP_DATA: the 20th goes out after the 21st
        seen += 1
        if seen == 20:
            held = packet
            continue
    out.write(packet)
    if held is not None and seen == 21:
        out.write(held)
        held = None
    out.flush()
"""


def test_replies_out_of_order_are_written_where_they_belong(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server answering READs out of order (OpenSSH's does not): what arrived in order is
    written out, the rest at its offsets, and the file is hashed from disk."""
    data = os.urandom(8 * MiB + 5)
    (tmp_path / "remote.bin").write_bytes(data)
    flushed: list[int] = []
    real = fileio.StagedWriter.flush_buffered

    def spy(stage: fileio.StagedWriter) -> None:
        flushed.append(stage._fill)
        real(stage)

    monkeypatch.setattr(fileio.StagedWriter, "flush_buffered", spy)
    pipe = servers.start(argv=[sys.executable, "-c", SWAP_REPLIES, servers.binary])
    assert pipe.handshake().read == 261120
    back = tmp_path / "back.bin"
    assert pipe.get(str(tmp_path / "remote.bin"), back, len(data), lambda n: None) == (
        len(data), hashlib.sha256(data).hexdigest())
    assert back.read_bytes() == data
    assert flushed == [19 * 261120 - fileio.STAGE]  # one whole stage was written before


def test_errors_carry_the_sftp_status_and_errno(servers: Servers, tmp_path: Path) -> None:
    """A missing remote file carries FX_NO_SUCH_FILE (``missing``), a refusal
    FX_PERMISSION_DENIED, a missing local file ENOENT and its path: callers read facts."""
    (tmp_path / "local.bin").write_bytes(b"x")
    pipe = servers.start("-P", "write")
    pipe.handshake()
    with pytest.raises(StorageError) as nope:
        pipe.get(str(tmp_path / "nope.bin"), tmp_path / "back.bin", 1, lambda n: None)
    assert (nope.value.code, nope.value.missing, nope.value.transient) == (
        "FX_NO_SUCH_FILE", True, False)
    assert nope.value.op == f"open {tmp_path / 'nope.bin'}"
    with pytest.raises(StorageError) as refused:
        pipe.put(tmp_path / "local.bin", str(tmp_path / "remote.bin"),
                 str(tmp_path / "remote.bin.traind-part"), lambda n: None)
    assert (refused.value.code, refused.value.missing) == ("FX_PERMISSION_DENIED", False)
    with pytest.raises(StorageError) as gone:
        pipe.put(tmp_path / "gone.bin", str(tmp_path / "remote.bin"),
                 str(tmp_path / "remote.bin.traind-part"), lambda n: None)
    assert (gone.value.code, gone.value.key, gone.value.op) == (
        "ENOENT", str(tmp_path / "gone.bin"), "read")

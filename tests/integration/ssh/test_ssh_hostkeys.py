"""Host keys are verified by default; unknown and changed keys are refused with what to do."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.requires import need_binary
from tests.support.sessions import NoSession
from tests.support.sshd import HOST, SSHServer, keygen

from traind.errors import StorageError


def _fingerprint(public_line: str) -> str:
    import asyncssh

    return str(asyncssh.import_public_key(public_line).get_fingerprint())


async def _probe_error(objects: Any) -> str:
    async with asyncio.timeout(20):
        with pytest.raises(StorageError) as caught:
            await objects.probe()
    return str(caught.value)


async def test_unknown_host_key_is_refused(
    sshd: SSHServer, make_store: Callable[..., Any], tmp_path: Path
) -> None:
    """A host missing from known_hosts is refused, naming its fingerprint and ssh-keyscan."""
    known_hosts = tmp_path / "empty_known_hosts"
    known_hosts.write_text("")
    message = await _probe_error(make_store(sshd, known_hosts=known_hosts))
    assert "host key not known" in message
    assert _fingerprint(sshd.host_key.public) in message
    assert f"ssh-keyscan -p {sshd.port} {HOST} >> {known_hosts}" in message


async def test_missing_known_hosts_file_is_refused(
    sshd: SSHServer, make_store: Callable[..., Any], tmp_path: Path
) -> None:
    """A known_hosts path that does not exist trusts nothing, and the error says so."""
    message = await _probe_error(make_store(sshd, known_hosts=tmp_path / "nope"))
    assert "host key not known" in message
    assert "does not exist" in message


async def test_changed_host_key_is_refused(
    sshd: SSHServer, make_store: Callable[..., Any], tmp_path: Path
) -> None:
    """A host whose key differs from known_hosts is refused as a possible attack."""
    other = keygen(tmp_path / "other_host_key")
    known_hosts = tmp_path / "stale_known_hosts"
    known_hosts.write_text(sshd.known_hosts_line(other.public) + "\n")
    message = await _probe_error(make_store(sshd, known_hosts=known_hosts))
    assert "HOST KEY CHANGED" in message
    assert _fingerprint(sshd.host_key.public) in message  # what the server offered
    assert _fingerprint(other.public) in message  # what known_hosts expected
    assert f"ssh-keygen -R '[{HOST}]:{sshd.port}'" in message


async def test_upload_refuses_changed_host_key_without_retrying(
    sshd: SSHServer, make_store: Callable[..., Any], tmp_path: Path, remote: Path
) -> None:
    """A host key problem is permanent: no reconnect loop, no file written."""
    other = keygen(tmp_path / "other_host_key")
    known_hosts = tmp_path / "stale_known_hosts"
    known_hosts.write_text(sshd.known_hosts_line(other.public) + "\n")
    objects = make_store(sshd, known_hosts=known_hosts, retries=5, backoff_initial=2,
                         backoff_max=2)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "a.bin").write_bytes(b"a")
    from traind.storage import LocalFile

    with capture_logs() as logs:
        async with asyncio.timeout(10):
            with pytest.raises(StorageError, match="HOST KEY CHANGED"):
                await objects.send("checkpoint-1/", tmp_path / "ckpt",
                                   [LocalFile("a.bin", 1)], NoSession())
    assert not [e for e in logs if e["event"] == "ssh_retry"]
    assert not [p for p in remote.rglob("*") if p.is_file()]


async def test_insecure_skip_connects_with_a_loud_warning(
    sshd: SSHServer, make_store: Callable[..., Any], tmp_path: Path
) -> None:
    """insecure_skip_host_key_check connects to an unknown host and warns on every connect."""
    known_hosts = tmp_path / "empty_known_hosts"
    known_hosts.write_text("")
    objects = make_store(sshd, known_hosts=known_hosts, insecure_skip_host_key_check=True)
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            await objects.probe()
            await objects.probe()
    warnings = [e for e in logs if e["event"] == "ssh_host_key_check_disabled"]
    assert len(warnings) == 2
    assert warnings[0]["log_level"] == "warning"


def test_rsync_ssh_command_refuses_unknown_host_key(sshd: SSHServer, tmp_path: Path) -> None:
    """The ssh command rsync mode runs checks host keys strictly and never prompts."""
    need_binary("ssh")
    from traind.config import SSHStorage
    from traind.storage.ssh.command import ssh_argv

    known_hosts = tmp_path / "empty_known_hosts"
    known_hosts.write_text("")
    config = SSHStorage(
        type="ssh", host=HOST, port=sshd.port, user=sshd.user,
        identity_file=sshd.user_key.path, remote_path="/tmp",
    )
    refused = subprocess.run(
        [*ssh_argv(config, known_hosts), HOST, "true"],
        capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
    )
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr
    accepted = subprocess.run(
        [*ssh_argv(config, sshd.known_hosts), HOST, "true"],
        capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL,
    )
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize("case", ["unknown", "changed"])
async def test_openssh_mode_refuses_unknown_and_changed_host_keys(
    case: str, sshd: SSHServer, openssh_error: Callable[..., Any], tmp_path: Path
) -> None:
    """The system ssh of the openssh mode checks host keys itself, and its refusal says what
    the SFTP mode says: unknown -> ssh-keyscan, changed -> HOST KEY CHANGED, ssh-keygen -R."""
    known_hosts = tmp_path / "known_hosts"
    other = keygen(tmp_path / "other_host_key")
    known_hosts.write_text("" if case == "unknown" else sshd.known_hosts_line(other.public) + "\n")
    message = str(await openssh_error(sshd, known_hosts=known_hosts))
    if case == "unknown":
        assert "host key not known: the server offered an ED25519 key" in message
        assert f"ssh-keyscan -p {sshd.port} {HOST} >> {known_hosts}" in message
    else:
        assert "HOST KEY CHANGED" in message
        assert _fingerprint(sshd.host_key.public) in message  # what the server offered
        assert _fingerprint(other.public) in message  # what known_hosts expected
        assert f"ssh-keygen -R '[{HOST}]:{sshd.port}'" in message

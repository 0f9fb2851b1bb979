"""Turning asyncssh and socket failures into StorageErrors that say what to do about them.

Transient errors (connection refused or dropped, timeouts, DNS hiccups) are retried by the
caller; everything else (authentication, host keys, remote permissions) is not.
"""

from __future__ import annotations

import errno
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from traind.errors import StorageError, TransientStorageError

_FX_NAMES = {
    value: name for name, value in vars(asyncssh).items()
    if name.startswith("FX_") and not name.endswith("_END") and isinstance(value, int)
}
"""SFTP status codes by name (``2`` → ``FX_NO_SUCH_FILE``)."""

# Failures of the SSH transport that a retry cannot fix.
_PERMANENT_DISCONNECTS = (
    asyncssh.KeyExchangeFailed,
    asyncssh.ProtocolNotSupported,
    asyncssh.IllegalUserName,
    asyncssh.ServiceNotAvailable,
)


@dataclass(frozen=True)
class SSHTarget:
    """Where we connect, as the error messages name it."""

    host: str
    port: int
    user: str

    def __str__(self) -> str:
        return f"ssh {self.user}@{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH names this host in known_hosts (``[host]:port`` unless port 22)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    @property
    def keyscan(self) -> str:
        """The ``ssh-keyscan`` invocation that prints this host's keys."""
        port = "" if self.port == 22 else f"-p {self.port} "
        return f"ssh-keyscan {port}{shlex.quote(self.host)}"


def host_key_error(target: SSHTarget, known_hosts: Path, offered: str) -> StorageError:
    """The error for a host key that ``known_hosts`` does not vouch for: unknown or changed.

    ``offered`` describes the key the server offered: its type and fingerprint, as known.
    """
    kh = shlex.quote(str(known_hosts))
    known = _known_keys(target, known_hosts)
    if known:
        listed = ", ".join(k.get_fingerprint() for k in known)
        return StorageError(
            f"{target}: HOST KEY CHANGED: the server offered {offered} but {known_hosts} "
            f"lists {listed} for {target.known_hosts_name}. Someone may be intercepting the "
            "connection (man-in-the-middle), or the host was reinstalled. Confirm the new "
            "fingerprint with the host's administrator, then replace the entry: "
            f"ssh-keygen -R {shlex.quote(target.known_hosts_name)} -f {kh} && "
            f"{target.keyscan} >> {kh}"
        )
    missing = "" if known_hosts.is_file() else " (the file does not exist)"
    return StorageError(
        f"{target}: host key not known: the server offered {offered}, which is not in "
        f"{known_hosts}{missing}. If that is the host's key, add it: "
        f"{target.keyscan} >> {kh}"
    )


def _known_keys(target: SSHTarget, known_hosts: Path) -> list[asyncssh.SSHKey]:
    if not known_hosts.is_file():
        return []
    try:
        port = None if target.port == 22 else target.port
        matched = asyncssh.match_known_hosts(str(known_hosts), target.host, "", port)
    except (OSError, ValueError):
        return []
    return list(matched[0])


def translate(exc: BaseException, target: SSHTarget, action: str) -> StorageError:
    """Classify ``exc`` (raised while doing ``action``) as a transient or permanent error,
    carrying its SFTP status or errno name as ``code``."""
    where = f"{target}: {action}"
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, asyncssh.PermissionDenied):
        return StorageError(f"{target}: authentication failed: {exc.reason}", op=action)
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return StorageError(f"{where}: host key not verifiable: {exc.reason}", op=action)
    if isinstance(exc, _PERMANENT_DISCONNECTS):
        return StorageError(f"{where}: {type(exc).__name__}: {exc.reason}", op=action)
    if isinstance(exc, asyncssh.SFTPError):
        return sftp_error(target, action, exc.code, exc.reason)
    if isinstance(exc, asyncssh.DisconnectError):
        return TransientStorageError(f"{where}: connection lost: {exc.reason}", op=action)
    if isinstance(exc, asyncssh.ChannelOpenError):
        return TransientStorageError(f"{where}: server refused a channel: {exc.reason}",
                                     op=action)
    if isinstance(exc, socket.gaierror):
        return dns_error(target, exc.strerror or str(exc))
    if isinstance(exc, ConnectionRefusedError):
        return refused_error(target)
    if isinstance(exc, TimeoutError):
        return TransientStorageError(f"{where}: timed out", op=action)
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
        return TransientStorageError(f"{where}: network error: {exc.strerror or exc}",
                                     code=code, op=action)
    return StorageError(f"{where}: {type(exc).__name__}: {exc}", op=action)


def sftp_error(host: object, action: str, code: int, reason: str) -> StorageError:
    """The error for an SFTP status ``code`` answering ``action`` on ``host`` (a SSHTarget or its
    name): a lost connection is transient, anything else (no such file, permission denied,
    a failure) is not."""
    where = f"{host}: {action}"
    name = _FX_NAMES.get(code, f"FX_{code}")
    if code in {asyncssh.FX_NO_CONNECTION, asyncssh.FX_CONNECTION_LOST}:
        return TransientStorageError(f"{where}: connection lost: {reason}", code=name,
                                     op=action)
    if code == asyncssh.FX_PERMISSION_DENIED:
        return StorageError(f"{where}: permission denied on the remote host: {reason}",
                            code=name, op=action)
    return StorageError(f"{where}: remote error: {reason}", code=name, op=action)


def auth_error(target: SSHTarget, identity_file: Path | None) -> StorageError:
    """The error for a server that accepted none of the keys offered."""
    keys = (f"identity_file {identity_file}" if identity_file
            else "ssh-agent and ~/.ssh/id_* keys")
    return StorageError(
        f"{target}: authentication failed: the server accepted none of the offered keys "
        f"({keys}); add the public key to ~/.ssh/authorized_keys of {target.user} on "
        f"{target.host}"
    )


def dns_error(target: SSHTarget, detail: str) -> TransientStorageError:
    """The error for a host name that does not resolve (retried: DNS hiccups pass)."""
    return TransientStorageError(
        f"{target}: cannot resolve host name {target.host!r} (DNS): {detail}"
    )


def refused_error(target: SSHTarget) -> TransientStorageError:
    """The error for a refused connection (retried: sshd may be restarting)."""
    return TransientStorageError(
        f"{target}: connection refused: nothing listens on port {target.port} "
        "(is sshd running, is the port right?)"
    )

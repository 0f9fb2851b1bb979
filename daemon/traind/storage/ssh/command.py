"""The system OpenSSH client as the ``rsync`` and ``openssh`` modes run it, and its failures.

The host-key policy is the SFTP mode's: ``StrictHostKeyChecking=yes`` against the same
known_hosts, never a prompt (``BatchMode``). What ssh prints when it fails is turned into the
errors the SFTP mode raises, so every mode says the same thing about the same problem.
"""

from __future__ import annotations

import re
from pathlib import Path

from traind.config import SSHStorage
from traind.errors import StorageError
from traind.storage.ssh.errors import auth_error, dns_error, host_key_error, refused_error
from traind.storage.ssh.link import CIPHERS, SSHLink


def ssh_argv(config: SSHStorage, known_hosts: Path) -> list[str]:
    """The ``ssh`` command (without destination): key, port and host-key policy from ``config``."""
    argv = [
        "ssh", "-p", str(config.port),
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={max(1, round(config.connect_timeout))}",
        "-o", f"ServerAliveInterval={max(1, round(config.keepalive))}",
        "-o", "ServerAliveCountMax=3",
        "-o", f"Ciphers=^{','.join(CIPHERS[:2])}",
        # A plain connection of its own, whatever ~/.ssh/config says: nothing forwarded, no
        # ControlMaster to share (or to leave running after us).
        "-o", "ClearAllForwardings=yes", "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
        "-o", "PermitLocalCommand=no", "-o", "ControlMaster=no", "-o", "ControlPath=none",
    ]
    if config.user:
        argv += ["-l", config.user]
    if config.identity_file:
        argv += ["-i", str(config.identity_file), "-o", "IdentitiesOnly=yes"]
    if config.insecure_skip_host_key_check:
        argv += [
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
        ]
    else:
        argv += [
            # Quoted: ssh splits this option on whitespace (it takes several files).
            "-o", "StrictHostKeyChecking=yes", "-o", f'UserKnownHostsFile="{known_hosts}"',
        ]
    return argv


def sftp_argv(config: SSHStorage, known_hosts: Path) -> list[str]:
    """``ssh ... -s <host> sftp``: the SFTP subsystem on stdin/stdout, no remote shell command."""
    return [*ssh_argv(config, known_hosts), "-s", "--", config.host, "sftp"]


def ssh_failure(stderr: str, link: SSHLink) -> StorageError | None:
    """The error ssh's ``stderr`` names (host key, login, DNS, port, subsystem), if any."""
    target = link.target
    if "Host key verification failed" in stderr:
        return host_key_error(target, link.known_hosts, _offered_key(stderr))
    if re.search(r"Permission denied \([a-z][a-z,-]*\)", stderr):  # not "(13)": EACCES
        return auth_error(target, link.config.identity_file)
    if dns := re.search(r"Could not resolve hostname [^:]*: (.*)", stderr):
        return dns_error(target, dns[1].strip())
    if "Connection refused" in stderr:
        return refused_error(target)
    if "subsystem request failed" in stderr:
        return StorageError(
            f"{target}: the server offers no sftp subsystem (Subsystem in its sshd_config)")
    return None


def _offered_key(stderr: str) -> str:
    """The host key ssh says the server offered: its type, and its fingerprint if shown."""
    changed = re.search(r"the (\S+) key sent by the remote host is\s+(SHA256:[\w+/=]+)", stderr)
    if changed:
        return f"{changed[1]} {changed[2]}"
    if unknown := re.search(r"No (\S+) host key is known", stderr):
        return f"an {unknown[1]} key"
    return "a key"

"""A real OpenSSH ``sshd`` for tests and benchmarks, on a free loopback port.

Everything it needs lives in one temporary directory: a throwaway host key and user key
(``ssh-keygen``), its own ``sshd_config``, ``authorized_keys`` and a ``known_hosts`` file for
clients. ``stop()`` kills the listener *and* every connection it serves (sshd's per-connection
children escape its process group, so they are found through ``/proc``); ``start()`` again
reuses the same port and keys, which is what fault tests need.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.net import free_port
from tests.support.requires import missing, need_binary

HOST = "127.0.0.1"
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                "/usr/libexec/sftp-server")


@dataclass(frozen=True)
class KeyPair:
    """A private key file and its public key line."""

    path: Path
    public: str


def keygen(path: Path) -> KeyPair:
    """Create an ed25519 key pair at ``path`` (no passphrase) with ``ssh-keygen``."""
    subprocess.run(
        [need_binary("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", "traind-test",
         "-f", str(path)],
        check=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    return KeyPair(path, path.with_name(path.name + ".pub").read_text().strip())



class SSHServer:
    """One sshd process (``-D -e -f``) serving ``user`` with key auth and internal-sftp."""

    def __init__(
        self,
        sshd: str,
        root: Path,
        *,
        port: int | None = None,
        read_only_sftp: bool = False,
        sftp_log: bool = False,
    ) -> None:
        self.sshd = sshd
        self.root = root
        self.port = port or free_port()
        self.user = getpass.getuser()
        root.mkdir(parents=True, exist_ok=True)
        self.host_key = keygen(root / "host_ed25519")
        self.user_key = keygen(root / "user_ed25519")
        self.known_hosts = root / "known_hosts"
        self.log = root / "sshd.log"
        self._read_only_sftp = read_only_sftp
        self._sftp_log = sftp_log
        self.sftp_log = root / "sftp.log"
        self._proc: subprocess.Popen[bytes] | None = None
        (root / "authorized_keys").write_text(self.user_key.public + "\n")
        self.known_hosts.write_text(self.known_hosts_line() + "\n")

    def known_hosts_line(self, public: str | None = None) -> str:
        """A known_hosts line for this server (``[127.0.0.1]:port``) with ``public`` or its key."""
        key_type, key_data = (public or self.host_key.public).split()[:2]
        return f"[{HOST}]:{self.port} {key_type} {key_data}"

    def _write_config(self) -> Path:
        read_only = " -R" if self._read_only_sftp else ""
        sftp = f"internal-sftp{read_only}"
        if self._sftp_log:
            # The external server, run through the user's shell, can log every operation
            # (open, posix-rename, remove, ...) to a file: tests check their order.
            server = next((p for p in SFTP_SERVERS if Path(p).exists()), None)
            if server is None:
                missing(f"no sftp-server (Debian openssh-sftp-server) in {SFTP_SERVERS}")
            log = shlex.quote(str(self.sftp_log))
            sftp = f"{server}{read_only} -e -l INFO 2>>{log}"
        config = self.root / "sshd_config"
        config.write_text(
            "\n".join([
                f"ListenAddress {HOST}",
                f"Port {self.port}",
                f'HostKey "{self.host_key.path}"',
                f'PidFile "{self.root / "sshd.pid"}"',
                f'AuthorizedKeysFile "{self.root / "authorized_keys"}"',
                "StrictModes no",
                "UsePAM no",
                "UseDNS no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "MaxStartups 64",
                "MaxSessions 64",
                "LogLevel INFO",
                f"Subsystem sftp {sftp}",
                "",
            ])
        )
        return config

    @property
    def pid(self) -> int | None:
        """The listener's process id while it runs."""
        return self._proc.pid if self.running and self._proc else None

    @property
    def running(self) -> bool:
        """Whether the listener process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start_sync(self, timeout: float = 10.0) -> None:
        """Start sshd and return once it answers with its SSH banner; raise if it does not."""
        if self.running:
            return
        if os.geteuid() == 0:
            # Privilege separation needs this directory (systemd creates it for the service).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        config = self._write_config()
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [self.sshd, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._proc.returncode}:\n{self.log_tail()}")
            if _banner(self.port):
                return
            time.sleep(0.02)
        self.stop_sync()
        raise TimeoutError(f"sshd did not answer within {timeout}s:\n{self.log_tail()}")

    def stop_sync(self, timeout: float = 5.0) -> None:
        """Kill every connection this sshd serves, then the listener; wait until they are gone."""
        if self._proc is None:
            return
        # Freeze the listener so it forks no new connection while its children are collected
        # (once it dies they are re-parented to init and can no longer be found).
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGSTOP)
        for pid in [*descendants(self._proc.pid), self._proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            self._proc.wait(timeout=timeout)
        finally:
            self._proc = None

    async def start(self, within: float = 10.0) -> None:
        """``start_sync`` in a worker thread (it gives up after ``within`` seconds)."""
        await asyncio.to_thread(self.start_sync, within)

    async def stop(self, within: float = 5.0) -> None:
        """``stop_sync`` in a worker thread (it gives up after ``within`` seconds)."""
        await asyncio.to_thread(self.stop_sync, within)

    def sftp_operations(self) -> list[str]:
        """The SFTP operations logged so far (``sftp_log=True``), e.g. ``remove name "/x"``."""
        try:
            text = self.sftp_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [line.split("]: ", 1)[-1] for line in text.splitlines()]

    def log_tail(self, lines: int = 20) -> str:
        """The last lines sshd logged (for failure messages)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _banner(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, found through /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces or parentheses: fields follow the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents[int(entry.name)] = ppid
    found: list[int] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found

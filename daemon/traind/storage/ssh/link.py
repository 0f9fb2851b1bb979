"""Connections to the storage host: host keys verified, reopened when they drop.

Host keys are verified against ``known_hosts`` (the configured file, else
``~/.ssh/known_hosts``); skipping that is possible only by an explicit config flag and is
logged as a warning on every connect. Transfers running at the same time get a connection
each (up to ``concurrency``): each has its own flow-control window, which is what limits one
SSH channel to window/RTT on long links, and its own sshd process on the server, which is
faster than channels sharing one (the README's SSH bench). ``call`` runs an SFTP operation and, when
the connection fails under it, reconnects with capped exponential backoff and runs it again.
"""

from __future__ import annotations

import asyncio
import getpass
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import asyncssh
import structlog

from traind.config import SSHStorage
from traind.errors import StorageError, TransientStorageError
from traind.storage.ssh.errors import SSHTarget, auth_error, host_key_error, translate
from traind.util.retry import Backoff
from traind.util.retry import retrying as retry

T = TypeVar("T")
log = structlog.get_logger("traind.ssh")

# AES-GCM first: with AES-NI it costs both ends far less CPU than chacha20-poly1305 (measured
# in bench/ssh_upload.py); the rest is asyncssh's default order, for servers without GCM.
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)


async def retrying(config: SSHStorage, action: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Await ``attempt()`` until it succeeds or fails for good: after a TransientStorageError
    it runs again, at most ``config.retries`` times, with capped exponential backoff."""

    def logged(exc: BaseException, n: int, delay: float) -> None:
        log.warning("ssh_retry", action=action, attempt=n, retry_in=delay, error=str(exc))

    backoff = Backoff(config.backoff_initial, config.backoff_max)
    return await retry(attempt, backoff, config.retries, on_retry=logged)


class _Client(asyncssh.SSHClient):
    """Remembers the host key a server offered when known_hosts did not vouch for it."""

    def __init__(self) -> None:
        self.offered: asyncssh.SSHKey | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.offered = key
        return False


@dataclass(eq=False)
class _Session:
    """One connection with its SFTP client, and how many operations use it right now."""

    conn: asyncssh.SSHClientConnection
    sftp: asyncssh.SFTPClient
    users: int = 0


class SSHLink:
    """The connections to one storage host, shared by every concurrent transfer."""

    def __init__(self, config: SSHStorage) -> None:
        self.config = config
        self.target = SSHTarget(config.host, config.port, config.user or getpass.getuser())
        self.known_hosts = (config.known_hosts or Path("~/.ssh/known_hosts")).expanduser()
        self._sessions: list[_Session] = []
        self._opening = 0
        self._lock = asyncio.Lock()

    async def connect(self) -> asyncssh.SSHClientConnection:
        """Open a new connection, host key verified; raise a translated StorageError."""
        cfg = self.config
        client = _Client()
        self.warn_if_unverified()
        started = time.monotonic()
        try:
            conn, _ = await asyncssh.create_connection(
                lambda: client,
                cfg.host,
                cfg.port,
                username=cfg.user or (),  # () = ~/.ssh/config's User, else the local user
                known_hosts=None if cfg.insecure_skip_host_key_check else self._known_hosts(),
                client_keys=[str(cfg.identity_file)] if cfg.identity_file else (),
                agent_path=None if cfg.identity_file else (),
                encryption_algs=list(CIPHERS),
                keepalive_interval=cfg.keepalive,
                keepalive_count_max=3,
                connect_timeout=cfg.connect_timeout,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            key = client.offered
            offered = f"{key.get_algorithm()} {key.get_fingerprint()}" if key else "a key"
            raise host_key_error(self.target, self.known_hosts, offered) from exc
        except asyncssh.PermissionDenied as exc:
            raise auth_error(self.target, cfg.identity_file) from exc
        except asyncssh.KeyImportError as exc:
            raise StorageError(
                f"{self.target}: cannot load identity_file {cfg.identity_file}: {exc} (a key "
                "with a passphrase needs ssh-agent: leave identity_file unset)"
            ) from exc
        except OSError as exc:
            if cfg.identity_file and not cfg.identity_file.is_file():
                raise StorageError(
                    f"{self.target}: identity_file {cfg.identity_file} does not exist"
                ) from exc
            raise translate(exc, self.target, "connect") from exc
        except asyncssh.Error as exc:  # (a TimeoutError is an OSError: translated above)
            raise translate(exc, self.target, "connect") from exc
        log.info(
            "ssh_connected", host=cfg.host, port=cfg.port, user=self.target.user,
            cipher=conn.get_extra_info("send_cipher"),
            seconds=round(time.monotonic() - started, 3),
        )
        return conn

    def warn_if_unverified(self) -> None:
        """Log the warning every connect without host-key verification must log."""
        if self.config.insecure_skip_host_key_check:
            log.warning(
                "ssh_host_key_check_disabled", host=self.config.host, port=self.config.port,
                risk="anyone on the network path can impersonate the storage host",
            )

    def _known_hosts(self) -> str | asyncssh.SSHKnownHosts:
        if self.known_hosts.is_file():
            return str(self.known_hosts)
        # A missing file trusts nothing: the connect fails with the "add it with" message.
        return asyncssh.import_known_hosts("")

    async def _lease(self) -> _Session:
        """A session to use: an idle one, a new one while fewer than ``concurrency`` are
        open (or opening), else the least busy one (an SFTP client can be shared)."""
        async with self._lock:
            self._sessions = [s for s in self._sessions if not s.conn.is_closed()]
            best = min(self._sessions, key=lambda s: s.users, default=None)
            room = len(self._sessions) + self._opening < self.config.concurrency
            if best is not None and (not best.users or not room):
                best.users += 1
                return best
            self._opening += 1
        try:  # outside the lock: a slow handshake does not hold up transfers already running
            session = await self._open()
        except StorageError:
            if best is None or best.conn.is_closed():
                raise
            session = best  # the server takes no more connections right now: share
        else:
            self._sessions.append(session)
        finally:
            self._opening -= 1
        session.users += 1
        return session

    async def _open(self) -> _Session:
        conn = await self.connect()
        try:
            return _Session(conn, await conn.start_sftp_client())
        except (asyncssh.Error, OSError) as exc:
            conn.abort()
            raise translate(exc, self.target, "start the SFTP subsystem") from exc

    async def call(self, action: str, op: Callable[[asyncssh.SFTPClient], Awaitable[T]]) -> T:
        """Run ``op`` on an SFTP client; reconnect with backoff while failures are transient.

        After ``retries`` reconnects the last error is raised as TransientStorageError, so
        the caller may try the whole operation again later.
        """

        async def attempt() -> T:
            session = await self._lease()
            try:
                return await op(session.sftp)
            except Exception as exc:  # translated just below; only transient ones are retried
                error = translate(exc, self.target, action)
                if isinstance(error, TransientStorageError):
                    session.conn.abort()  # whatever failed under it, the next try reconnects
                raise error from exc
            finally:
                session.users -= 1

        return await retrying(self.config, action, attempt)

    async def aclose(self) -> None:
        """Close every connection and wait (briefly) until they are closed."""
        async with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.sftp.exit()
            session.conn.close()
        for session in sessions:
            try:
                await asyncio.wait_for(session.conn.wait_closed(), timeout=5)
            except (TimeoutError, asyncssh.Error, OSError):
                session.conn.abort()

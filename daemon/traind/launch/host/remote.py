"""Working on a host over SSH: commands through asyncssh, files through rsync over ``ssh``.

Host keys are always verified against the endpoint's known_hosts file (asyncssh for commands,
``StrictHostKeyChecking=yes`` for rsync). Hosts whose key cannot be known in advance (a freshly
rented container) are trusted on first use by ``trust_on_first_use``, which records the key in
a per-launch file and logs its fingerprint; every later connection must present that key.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

import asyncssh
import structlog

from traind.launch.base import LineSink, RemoteResult, SSHEndpoint
from traind.launch.errors import HostUnreachableError, LaunchError, RemoteCommandError
from traind.launch.host.commands import check, rsync_argv, run_local, source_and_target

log = structlog.get_logger("traind.launch")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shell_line(command: str | Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """One POSIX shell line: ``command`` (an argv is quoted) after ``export``s of ``env``."""
    line = command if isinstance(command, str) else shlex.join(command)
    if not env:
        return line
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise LaunchError(f"not an environment variable name: {name!r}")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"export {exports}; {line}"


class SSHRemote:
    """One host reached over SSH; every call opens its own short-lived connection."""

    def __init__(self, endpoint: SSHEndpoint, connect_timeout: float = 20.0) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout

    async def connect(self) -> asyncssh.SSHClientConnection:
        """A verified, authenticated connection; HostUnreachableError saying why not."""
        ep = self.endpoint
        known = Path(ep.known_hosts or "~/.ssh/known_hosts").expanduser()
        try:
            return await asyncssh.connect(
                ep.host, ep.port, username=ep.user,
                known_hosts=str(known) if known.is_file() else asyncssh.import_known_hosts(""),
                client_keys=[ep.identity_file] if ep.identity_file else (),
                agent_path=None if ep.identity_file else (),
                connect_timeout=self.connect_timeout, keepalive_interval=15,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostUnreachableError(
                f"ssh {ep}: host key not trusted by {known} ({exc.reason}); check the host, "
                f"then add its key: ssh-keyscan -p {ep.port} {ep.host} >> {known}"
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise HostUnreachableError(f"ssh {ep}: authentication failed ({exc.reason})") from exc
        except (OSError, TimeoutError, asyncssh.Error) as exc:
            raise HostUnreachableError(f"ssh {ep}: cannot connect: {exc}") from exc

    async def run(
        self, command: str | Sequence[str], env: Mapping[str, str] | None = None,
        stream: LineSink | None = None, within: float | None = None,
    ) -> RemoteResult:
        """Run one shell line (stdin closed); stdout lines go to ``stream``."""
        started = time.monotonic()
        line = shell_line(command, env)
        tail: deque[str] = deque(maxlen=20)
        sink = stream or (lambda _: None)
        conn = await self.connect()
        try:
            async with asyncio.timeout(within):
                proc = await conn.create_process(line, encoding="utf-8", errors="replace")
                proc.stdin.write_eof()

                async def pump(reader: asyncssh.SSHReader[str], to: LineSink) -> None:
                    # Not ``async for``: asyncssh's iterator can yield a final "" at EOF.
                    while text := await reader.readline():
                        to(text.rstrip("\n"))

                await asyncio.gather(pump(proc.stdout, sink), pump(proc.stderr, tail.append))
                done = await proc.wait()
        except TimeoutError as exc:
            shown = shell_line(command)[:80]  # not its exports: [run] env holds tokens
            raise RemoteCommandError(
                f"ssh {self.endpoint}: {shown!r} did not finish within {within}s"
            ) from exc
        except (OSError, asyncssh.Error) as exc:
            raise HostUnreachableError(f"ssh {self.endpoint}: connection lost: {exc}") from exc
        finally:
            conn.abort()
        code = done.exit_status if done.exit_status is not None else 255
        return RemoteResult(code, time.monotonic() - started, "\n".join(tail))

    def ssh_argv(self) -> list[str]:
        """The ``ssh`` command rsync runs: same key, same host-key policy as asyncssh."""
        ep = self.endpoint
        known = Path(ep.known_hosts or "~/.ssh/known_hosts").expanduser()
        argv = [
            "ssh", "-p", str(ep.port), "-l", ep.user, "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
            "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o", "ServerAliveInterval=15",
        ]
        if ep.identity_file:
            argv += ["-i", ep.identity_file, "-o", "IdentitiesOnly=yes"]
        return argv

    def _spec(self, path: str) -> str:
        host = f"[{self.endpoint.host}]" if ":" in self.endpoint.host else self.endpoint.host
        return f"{host}:{path}"

    async def sync_to(
        self, local: Path, remote: str, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False, within: float | None = None,
    ) -> None:
        """rsync ``local`` (a directory's contents, or a file) to ``remote``."""
        src, dst, make = source_and_target(local, remote)
        argv = rsync_argv(src, self._spec(dst), excludes=excludes, includes=includes,
                          delete=delete, ssh=self.ssh_argv(), make_dir=make)
        check(await run_local(argv, within=within, what="rsync"), f"rsync to {self.endpoint}")

    async def sync_from(
        self, remote: str, local: Path, excludes: Sequence[str] = (),
        includes: Sequence[str] = (), delete: bool = False, within: float | None = None,
    ) -> None:
        """rsync the contents of directory ``remote`` into ``local``."""
        local.mkdir(parents=True, exist_ok=True)
        argv = rsync_argv(self._spec(f"{remote.rstrip('/')}/"), f"{local}/", excludes=excludes,
                          includes=includes, delete=delete, ssh=self.ssh_argv())
        check(await run_local(argv, within=within, what="rsync"), f"rsync from {self.endpoint}")


async def trust_on_first_use(endpoint: SSHEndpoint, within: float = 20.0) -> None:
    """Record the host key ``endpoint`` offers now in its (per-launch) known_hosts file,
    unless that file already has a key for it."""
    assert endpoint.known_hosts is not None
    path = Path(endpoint.known_hosts)
    name = endpoint.host if endpoint.port == 22 else f"[{endpoint.host}]:{endpoint.port}"
    if path.is_file() and any(
        line.split(" ", 1)[0] == name for line in path.read_text().splitlines()
    ):
        return
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(endpoint.host, endpoint.port), within
        )
    except (OSError, TimeoutError, asyncssh.Error) as exc:
        raise HostUnreachableError(f"ssh {endpoint}: cannot fetch the host key: {exc}") from exc
    if key is None:
        raise HostUnreachableError(f"ssh {endpoint}: the host offered no key")
    public = key.export_public_key("openssh").decode().split()[:2]
    await asyncio.to_thread(_append, path, f"{name} {' '.join(public)}\n")
    log.warning("ssh_host_key_trusted_on_first_use", endpoint=str(endpoint),
                fingerprint=key.get_fingerprint(), known_hosts=str(path))


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line)

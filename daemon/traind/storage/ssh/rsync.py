"""The optional ``transfer = "rsync"`` mode: the system ``rsync`` over ``ssh``.

Same host-key policy as the SFTP mode (``command``). No shell string is built from a
path: file names go to rsync NUL-separated on stdin (``--files-from=- --from0``, each as
``./<name>``, see ``files_from``) and ``--secluded-args`` hands the remote rsync its
arguments through the protocol. rsync writes each file in a scratch directory
(``--temp-dir``, removed afterwards), fsyncs it (``--fsync``) and renames it into place.
sha256 for the manifest is computed locally while rsync runs; a rerun after a dropped
connection skips the files rsync already finished. Bytes sent are reported as rsync's
``--info=progress2`` counts them, so progress moves during a big file.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
import secrets
import shlex
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import asyncssh

from traind.config import SSHStorage
from traind.errors import StorageError, TransientStorageError, UnsafePathError
from traind.storage.base import LocalFile, UploadSession, counted
from traind.storage.ssh.command import ssh_argv, ssh_failure
from traind.storage.ssh.link import SSHLink, retrying
from traind.storage.ssh.sftp import makedirs
from traind.util.fileio import hash_file, in_thread
from traind.util.proc import child
from traind.util.tasks import fan_out

MIN_VERSION = (3, 2, 4)
"""The first rsync with ``--fsync`` (and ``--secluded-args``); needed at both ends."""

SCRATCH = ".traind-rsync-tmp"
"""The start of rsync's ``--temp-dir`` inside the checkpoint directory, one per run (two hosts
may send parts of one checkpoint at once): removed after every successful run, so temporary
files left by a killed transfer do not outlive the upload."""

_PROGRESS = re.compile(rb"\s*([\d,]+)\s+\d+%")
"""A ``--info=progress2`` line: the bytes sent so far in this run, then a percentage."""

# rsync exit codes worth a retry: socket I/O, protocol stream, timeouts, and 255 (ssh failed).
_TRANSIENT_CODES = {5, 10, 12, 30, 35, 255}

KILL_WAIT = 5.0
"""Seconds a cancelled run waits for rsync to go after SIGKILL to its process group."""

VERSION_WITHIN = 30.0
"""Seconds ``rsync --version`` (here, and on the remote host) has to answer in a probe."""


def rsync_argv(config: SSHStorage, known_hosts: Path, root: Path, remote_dir: str,
               scratch: str = SCRATCH) -> list[str]:
    """The full rsync command pushing the files listed on stdin from ``root`` to
    ``remote_dir``, through the temporary directory ``scratch`` in it."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    if remote_dir.startswith(":"):
        remote_dir = "./" + remote_dir  # "host::x" would mean an rsync daemon module
    timeout = max(30, round(config.keepalive * 4))
    return [
        "rsync", "--secluded-args", "--files-from=-", "--from0", "--times", "--fsync",
        f"--temp-dir={scratch}", f"--timeout={timeout}", "--info=progress2",
        "-e", " ".join(shlex.quote(a) for a in ssh_argv(config, known_hosts)),
        "--", f"{root.resolve()}/", f"{host}:{remote_dir}/",
    ]


class RsyncTransfer:
    """Uploads a checkpoint's files with one rsync run, rerun on transient failures."""

    def __init__(self, config: SSHStorage, link: SSHLink) -> None:
        self._config = config
        self._link = link

    async def upload(
        self, remote_dir: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Send ``files`` into ``remote_dir`` (which exists), then report each as done."""
        if any(f.path.split("/")[0].startswith(SCRATCH) for f in files):
            raise UnsafePathError(f"a checkpoint may not contain {SCRATCH}* in rsync mode")
        name = f"{SCRATCH}-{secrets.token_hex(6)}"
        scratch = posixpath.join(remote_dir, name)
        await self._link.call(f"create {scratch}", lambda sftp: makedirs(sftp, {scratch}))
        hashing = asyncio.ensure_future(_hash_all(root, files))
        try:
            with counted(session.advance) as sent:
                await self._run_with_retries(root, remote_dir, files, sent, name)
            await self._link.call(f"remove {scratch}", lambda sftp: sftp.rmtree(scratch))
            shas = await hashing
        finally:
            if not hashing.done():
                hashing.cancel()
                await asyncio.gather(hashing, return_exceptions=True)
        if rest := sum(f.size for f in files) - sent.moved:
            session.advance(rest)  # what rsync did not count (a file it found already there)
        for f in files:
            await session.file_done(f.path, shas[f.path])

    async def _run_with_retries(
        self, root: Path, remote_dir: str, files: Sequence[LocalFile],
        advance: Callable[[int], None], scratch: str,
    ) -> None:
        argv = rsync_argv(self._config, self._link.known_hosts, root, remote_dir, scratch)
        listing = files_from(files)

        async def attempt() -> None:
            with counted(advance) as moved:  # a failed run's bytes are counted by its rerun
                await _run(argv, listing, self._link, moved)

        await retrying(self._config, "rsync", attempt)


def files_from(files: Sequence[LocalFile]) -> bytes:
    """The ``--files-from=- --from0`` list naming ``files``: each as ``./<path>``, because
    rsync skips an entry starting with ``#`` or ``;`` as a comment (and an empty one); the
    ``./`` is where ``--relative`` starts the stored name, so it stays exactly ``<path>``."""
    return b"".join(b"./" + f.path.encode() + b"\0" for f in files)


async def probe(link: SSHLink, conn: asyncssh.SSHClientConnection) -> None:
    """Check rsync and ssh exist here, and rsync >= 3.2.4 (``--fsync``) at both ends."""
    for tool in ("rsync", "ssh"):
        if shutil.which(tool) is None:
            raise StorageError(f'transfer = "rsync" needs {tool!r} on this host\'s PATH')
    local = await child.spawn(["rsync", "--version"], stdout=asyncio.subprocess.PIPE,
                              stderr=asyncio.subprocess.DEVNULL)
    try:  # one that does not answer in time is killed with its group, not left behind
        async with child.stopped_on_error(local, KILL_WAIT):
            out, _ = await asyncio.wait_for(local.communicate(), timeout=VERSION_WITHIN)
    except TimeoutError:
        raise StorageError(f"rsync --version gave no answer within {VERSION_WITHIN:g} s") from None
    _check_version("this host", out.decode(errors="replace"))
    try:
        # A constant command line: nothing from config or paths reaches the remote shell.
        result = await asyncio.wait_for(conn.run("rsync --version", check=False),
                                        timeout=VERSION_WITHIN)
    except (asyncssh.Error, OSError, TimeoutError) as exc:
        raise StorageError(f"{link.target}: cannot run rsync remotely: {exc}") from exc
    if result.exit_status != 0:
        raise StorageError(
            f"{link.target}: rsync is not usable on the remote host "
            f"(exit {result.exit_status}): {str(result.stderr or '').strip()[:200]}"
        )
    _check_version(f"{link.target}", str(result.stdout or ""))


def _check_version(where: str, version_output: str) -> None:
    found = re.search(r"version\s+(\d+)\.(\d+)\.(\d+)", version_output)
    version = tuple(int(x) for x in found.groups()) if found else (0, 0, 0)
    if version < MIN_VERSION:
        shown = ".".join(map(str, version)) if found else "unknown"
        raise StorageError(
            f'{where}: rsync {shown} is too old for transfer = "rsync" (needs '
            f"{'.'.join(map(str, MIN_VERSION))} for --fsync); use transfer = \"sftp\""
        )


async def _hash_all(root: Path, files: Sequence[LocalFile]) -> dict[str, str]:
    async def one(f: LocalFile) -> tuple[str, str]:
        _, sha = await in_thread("read", root / f.path, hash_file, root / f.path)
        return f.path, sha

    return dict(await fan_out(files, 2, one))


def progress_totals(buffer: bytes) -> tuple[list[int], bytes]:
    """The byte totals of the complete ``--info=progress2`` lines in ``buffer`` (rsync ends
    them with ``\\r``, or ``\\n`` after a file), and the incomplete rest."""
    *lines, rest = re.split(rb"[\r\n]", buffer)
    return [int(m[1].replace(b",", b"")) for line in lines if (m := _PROGRESS.match(line))], rest


async def _run(
    argv: list[str], listing: bytes, link: SSHLink, advance: Callable[[int], None]
) -> None:
    """Run rsync once, reporting its progress through ``advance``; translate a failure into
    a (transient or permanent) StorageError."""
    proc = await child.spawn(argv, transfer=True, stdin=asyncio.subprocess.PIPE,
                             stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdin, stdout, stderr_pipe = proc.stdin, proc.stdout, proc.stderr
    assert stdin is not None
    assert stdout is not None
    assert stderr_pipe is not None

    async def feed() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # rsync died: see rc
            stdin.write(listing)
            await stdin.drain()
            stdin.close()

    async def follow() -> None:
        sent, rest = 0, b""
        while chunk := await stdout.read(65536):
            totals, rest = progress_totals(rest + chunk)
            for total in totals:
                if total > sent:
                    advance(total - sent)
                    sent = total

    # Cancelled: rsync and its ssh child go down with their process group.
    async with child.stopped_on_error(proc, KILL_WAIT):
        _, _, stderr = await asyncio.gather(feed(), follow(), stderr_pipe.read())
        await proc.wait()
    if proc.returncode == 0:
        return
    text = stderr.decode(errors="replace").strip()
    tail = " | ".join(text.splitlines()[-3:])
    if known := ssh_failure(text, link):
        raise known
    if "command not found" in text:
        raise StorageError(f"{link.target}: rsync is not installed on the remote host: {tail}")
    error = TransientStorageError if proc.returncode in _TRANSIENT_CODES else StorageError
    raise error(f"{link.target}: rsync exited with {proc.returncode}: {tail}")

"""Local child processes for the adapters: ``rsync`` (locally or over ssh) and shell commands.

Each child runs in its own process group, so a timeout or a cancellation kills it together
with whatever it started (rsync's ssh, a shell's children).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from traind.launch.base import LineSink, RemoteResult
from traind.launch.errors import RemoteCommandError
from traind.util.proc import child

KILL_WAIT = 5.0
"""Seconds a child that timed out or was cancelled gets to go after SIGKILL to its group."""


def rsync_argv(
    src: str, dst: str, *, excludes: Sequence[str] = (), includes: Sequence[str] = (),
    delete: bool = False, ssh: Sequence[str] | None = None, make_dir: str | None = None,
) -> list[str]:
    """An rsync command copying ``src`` to ``dst`` (archive mode, arguments kept from the
    remote shell). ``make_dir`` is created on the remote side first."""
    argv = ["rsync", "-a", "-s", "--partial"]
    argv += [f"--include={p}" for p in includes] + [f"--exclude={p}" for p in excludes]
    if delete:
        argv.append("--delete")
    if ssh is not None:
        argv += ["-e", shlex.join(ssh)]
    if make_dir is not None:
        argv.append(f"--rsync-path=mkdir -p {shlex.quote(make_dir)} && rsync")
    return [*argv, "--", src, dst]


def source_and_target(local: Path, remote: str) -> tuple[str, str, str]:
    """rsync's source and destination for ``local`` → ``remote``, and the dir to create there.

    A directory's contents go into ``remote``; a file becomes ``remote``.
    """
    if local.is_dir():
        return f"{local}/", f"{remote.rstrip('/')}/", remote
    parent = remote.rsplit("/", 1)[0] if "/" in remote else "."
    return str(local), remote, parent or "/"


async def run_local(
    argv: Sequence[str], *, stream: LineSink | None = None, within: float | None = None,
    cwd: Path | None = None, env: dict[str, str] | None = None, what: str = "command",
) -> RemoteResult:
    """Run ``argv`` for at most ``within`` seconds; stdout lines go to ``stream``, stderr's
    tail into the result."""
    started = time.monotonic()
    proc = await child.spawn(
        argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=cwd, env=env,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    tail: deque[str] = deque(maxlen=20)

    async def lines(reader: asyncio.StreamReader, sink: LineSink) -> None:
        async for raw in reader:
            sink(raw.decode(errors="replace").rstrip("\n"))

    try:
        async with child.stopped_on_error(proc, KILL_WAIT), asyncio.timeout(within):
            await asyncio.gather(
                lines(proc.stdout, stream or (lambda _: None)), lines(proc.stderr, tail.append)
            )
            code = await proc.wait()
    except TimeoutError as exc:
        raise RemoteCommandError(f"{what} did not finish within {within}s") from exc
    return RemoteResult(
        code if code >= 0 else 128 - code, time.monotonic() - started, "\n".join(tail)
    )


def check(result: RemoteResult, what: str) -> RemoteResult:
    """``result`` if it exited 0, else RemoteCommandError with stderr's tail."""
    if result.exit_code != 0:
        detail = " | ".join(result.stderr_tail.splitlines()[-3:])
        raise RemoteCommandError(f"{what} exited with {result.exit_code}: {detail}")
    return result

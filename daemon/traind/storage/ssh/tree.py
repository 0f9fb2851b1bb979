"""Walking and pruning a remote directory tree over SFTP, a bounded number of requests at
once: what the store's ``list`` and ``delete`` are made of.

SFTP has no recursive listing, so the tree is read one level at a time, every directory of
a level at once (``IN_FLIGHT`` at most), pruned to the directories a key under the prefix
can be in. A directory gone or turned into a file meanwhile lists as empty.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence

import asyncssh

from traind.storage.base import ObjectMeta
from traind.storage.ssh.sftp import remove
from traind.util.tasks import fan_out

IN_FLIGHT = 32
"""Directory reads or removals in flight on one SFTP client: enough to hide the round trip."""

_GONE = (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNotADirectory, asyncssh.SFTPFailure)
"""How a directory that is not there (any more), or is a file, answers a read."""


async def entries(sftp: asyncssh.SFTPClient, path: str) -> list[tuple[str, asyncssh.SFTPAttrs]]:
    """The names in directory ``path`` (but ``.`` and ``..``) with their attributes; none
    when it is gone."""
    try:
        found = await sftp.readdir(path)
    except _GONE:
        return []
    names = ((os.fsdecode(e.filename), e.attrs) for e in found)
    return [(name, attrs) for name, attrs in names if name not in {".", ".."}]


async def dirs(sftp: asyncssh.SFTPClient, path: str) -> list[str]:
    """The names of the directories directly in ``path``, sorted; none when it is gone."""
    return sorted(name for name, attrs in await entries(sftp, path)
                  if attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY)


async def files(sftp: asyncssh.SFTPClient, root: str, top: str, prefix: str
                ) -> list[ObjectMeta]:
    """Every regular file at any depth under ``root/top`` whose key (its path relative to
    ``root``) starts with ``prefix``, with its size and mtime; none through a link (a
    directory's entries say what each is without following it)."""
    found: list[ObjectMeta] = []
    level = [top]
    while level:
        listings = await fan_out(
            level, IN_FLIGHT, lambda d: entries(sftp, posixpath.join(root, d) if d else root))
        deeper = []
        for parent, listing in zip(level, listings, strict=True):
            for name, attrs in listing:
                key = f"{parent}/{name}" if parent else name
                if attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
                    if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                        deeper.append(key)
                elif attrs.type == asyncssh.FILEXFER_TYPE_REGULAR and key.startswith(prefix):
                    found.append(ObjectMeta(key, attrs.size or 0, attrs.mtime))
        level = deeper
    return found


async def lstat(sftp: asyncssh.SFTPClient, paths: Iterable[str]
                ) -> dict[str, asyncssh.SFTPAttrs | None]:
    """Each of ``paths``'s attributes as ``lstat`` finds them, a final link not followed;
    None when there is none."""
    async def one(path: str) -> tuple[str, asyncssh.SFTPAttrs | None]:
        try:
            return path, await sftp.lstat(path)
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNotADirectory):
            return path, None

    return dict(await fan_out(sorted(set(paths)), IN_FLIGHT, one))


def mode(attrs: asyncssh.SFTPAttrs) -> int:
    """The file type and permission bits of ``attrs`` (0: the server did not say)."""
    return attrs.permissions or 0


def chain(root: str, directory: str) -> list[str]:
    """``root`` and each directory from it down to ``directory`` (which is under it)."""
    found = [root]
    for part in posixpath.relpath(directory, root).split("/"):
        if part != ".":
            found.append(posixpath.join(found[-1], part))
    return found


async def remove_files(sftp: asyncssh.SFTPClient, root: str, paths: Sequence[str]) -> None:
    """Remove ``paths`` (missing ones are fine), then every directory they leave empty, up
    to ``root`` (which stays): a tag's directory goes with its last object."""
    await fan_out(paths, IN_FLIGHT, lambda p: remove(sftp, p))
    tried: set[str] = set()
    for d in sorted({posixpath.dirname(p) for p in paths}, key=lambda p: p.count("/"),
                    reverse=True):  # children before their parents
        while d.startswith(root + "/") and d not in tried:
            tried.add(d)
            try:
                await sftp.rmdir(d)
            except asyncssh.SFTPNoSuchFile:
                pass  # removed meanwhile: its parent may be empty now
            except (asyncssh.SFTPFailure, asyncssh.SFTPDirNotEmpty):
                break  # not empty (SFTP v3 says so as a plain failure)
            d = posixpath.dirname(d)

"""What the SSH store checks before it reads or writes a path: every directory from the run's
to it a directory (never a link out of the store), every file read a regular file of its
size; one round of ``lstat`` each time, so a FIFO or a link to ``/dev/zero`` is never opened."""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Callable, Iterable, Sequence

import asyncssh

from traind.errors import IntegrityError
from traind.storage.ssh import tree
from traind.storage.ssh.sftp import parents
from traind.util.fileio import not_a_directory, not_regular, size_differs


class PathGuard:
    """The checks for the run's directory ``root`` on the host ``host()`` names."""

    def __init__(self, root: str, host: Callable[[], str]) -> None:
        self._root = root
        self._host = host

    async def looked(self, sftp: asyncssh.SFTPClient, dirs: Iterable[str],
                      files: Iterable[str] = (), *, write: bool
                      ) -> dict[str, asyncssh.SFTPAttrs | None]:
        """The attributes of ``files`` (None: missing) once the run's directory and each
        directory from it to each of ``dirs`` are found to be directories or missing (to be
        made), all in one round of ``lstat``: else LinkedPathError, for a write or at the
        run's directory, or, for a read, IntegrityError (the checkpoint's corruption)."""
        steps = {d for directory in dirs for d in tree.chain(self._root, directory)}
        wanted = set(files)
        found = await tree.lstat(sftp, steps | wanted)
        for d in sorted(steps, key=lambda d: d.count("/")):  # the outermost first
            if (attrs := found[d]) is not None and not stat.S_ISDIR(tree.mode(attrs)):
                raise not_a_directory(self.at(d), tree.mode(attrs),
                                      write=write or d == self._root)
        return {f: found[f] for f in wanted}

    async def regular(self, sftp: asyncssh.SFTPClient, path: str) -> bool:
        """Whether the object at ``path`` is there, as a regular file read through no link;
        IntegrityError naming it when it is something else."""
        found = await self.looked(sftp, [posixpath.dirname(path)], [path], write=False)
        if (attrs := found[path]) is not None and not stat.S_ISREG(tree.mode(attrs)):
            raise not_regular(self.at(path), tree.mode(attrs))
        return attrs is not None

    async def fetchable(self, sftp: asyncssh.SFTPClient,
                         files: Sequence[tuple[str, int]]) -> None:
        """Raise IntegrityError naming the first of ``files`` (remote path, size) that is not
        a regular file of its size read through no link, before the server opens any: a
        FIFO would block that open, a link to ``/dev/zero`` never end. One round of
        ``lstat`` for them all."""
        paths = [path for path, _ in files]
        found = await self.looked(sftp, parents(paths), paths, write=False)
        for path, size in files:
            if (attrs := found[path]) is None:
                raise IntegrityError(f"{self.at(path)}: missing from the store")
            if not stat.S_ISREG(tree.mode(attrs)):
                raise not_regular(self.at(path), tree.mode(attrs))
            if attrs.size != size:
                raise size_differs(self.at(path), attrs.size or 0, size)

    def at(self, path: str) -> str:
        """``host:path``, for a message."""
        return f"{self._host()}:{path}"

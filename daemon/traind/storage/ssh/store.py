"""The SSH store: objects as files under ``<remote_path>/<run>/`` on any host you can ssh
into, every primitive an SFTP call (no shell).

Small objects are written whole under a temporary name, fsynced and renamed; a create-only
put is written under a unique name and hard-linked into place, which fails when the name
exists; a replace-if-version put reads, compares and renames, so ``update`` is False, as on
a local disk. Keys are validated again here before they become remote paths. The
connection lives in ``link`` (host keys, reconnects); checkpoint files move by ``send`` and
``fetch`` over asyncssh (``sftp``), the system ssh client speaking SFTP (``openssh/``), or
one rsync run (``rsync``).
"""

from __future__ import annotations

import asyncio
import builtins
import posixpath
import secrets
import stat
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar, cast

import asyncssh
import structlog

from traind.config import SSHStorage
from traind.errors import IntegrityError, StorageError, TransientStorageError
from traind.layout.keys import check_component, check_key, check_relpath
from traind.storage.base import (
    OVERWRITE,
    Advance,
    Blob,
    Capabilities,
    LocalFile,
    ObjectMeta,
    PutMode,
    UploadSession,
)
from traind.storage.memory import version_of
from traind.storage.ssh import rsync as ssh_rsync
from traind.storage.ssh import tree
from traind.storage.ssh.errors import translate
from traind.storage.ssh.guard import PathGuard
from traind.storage.ssh.link import SSHLink
from traind.storage.ssh.openssh.transfer import OpenSSHTransfer
from traind.storage.ssh.sftp import (
    create_new,
    get_file,
    makedirs,
    parents,
    put_file,
    read_bytes,
    remove,
    write_bytes,
)
from traind.util.fileio import not_a_directory, temporary_name
from traind.util.tasks import fan_out

T = TypeVar("T")
log = structlog.get_logger("traind.ssh")

EXCLUSIVE = "exclusive create over SFTP (hard link, else O_EXCL): a tag is one writer's"
NOT_EXCLUSIVE = ("claims listed after writing (this SFTP server lets an exclusive create "
                 "replace a file): a tag is one writer's")


class SSHStore:
    """Objects as files under ``<remote_path>/<run>/`` on an SSH host."""

    def __init__(self, config: SSHStorage, run: str) -> None:
        self._config = config
        self._root = posixpath.join(config.remote_path, check_component(run, "run name"))
        self._guard = PathGuard(self._root, lambda: self._link.target.host)
        self._link = SSHLink(config)
        self._rsync = ssh_rsync.RsyncTransfer(config, self._link)
        self._owner = secrets.token_hex(6)
        """In this store's temporary names: two hosts sending one path never share one, and
        a retry writes over its own failed attempt."""
        self._openssh = (OpenSSHTransfer(self._link, self._owner)
                         if config.transfer == "openssh" else None)
        self._capabilities: Capabilities | None = None
        self._finding = asyncio.Lock()

    @property
    def describe(self) -> str:
        """``ssh://user@host:port/<remote_path>/<run>`` (``/~/`` when relative to home)."""
        target = self._link.target
        root = self._root if self._root.startswith("/") else f"~/{self._root}"
        return f"ssh://{target.user}@{target.host}:{target.port}/{root.lstrip('/')}"

    def where(self, key: str) -> str:
        return f"{self._link.target.host}:{posixpath.join(self._root, key)}"

    def _path(self, key: str) -> str:
        return posixpath.join(self._root, check_key(key))

    def _dir(self, prefix: str) -> str:
        """The directory every key starting with ``prefix`` is under (the root for none)."""
        top, slash, _ = prefix.rpartition("/")
        return posixpath.join(self._root, check_key(top)) if slash else self._root

    async def _call(self, action: str, op: Callable[[asyncssh.SFTPClient], Awaitable[T]]) -> T:
        """``link.call(action, op)``; in the openssh mode, with an ssh starting meanwhile for
        the transfer that usually follows (``OpenSSHTransfer.warm``)."""
        if self._openssh:
            self._openssh.warm()
        return await self._link.call(action, op)

    async def capabilities(self) -> Capabilities:
        """Whether this server's exclusive create is exclusive (one check, then remembered)."""
        async with self._finding:
            if self._capabilities is None:
                exclusive = await self._call(
                    f"create a file exclusively in {self._root}", self._exclusive)
                self._found(exclusive)
        assert self._capabilities is not None
        return self._capabilities

    async def _exclusive(self, sftp: asyncssh.SFTPClient) -> bool:
        """Whether a second exclusive create of one name fails, as it must."""
        await makedirs(sftp, {self._root})
        probe = posixpath.join(self._root, f".traind-probe-{secrets.token_hex(4)}")
        try:
            return await create_new(sftp, probe, b"1") and not await create_new(
                sftp, probe, b"2")
        finally:
            await remove(sftp, probe)

    def _found(self, exclusive: bool) -> None:
        if not exclusive:
            log.warning("ssh_exclusive_create_ignored", root=self._root)
        self._capabilities = Capabilities(create=exclusive, update=False,
                                          claim=EXCLUSIVE if exclusive else NOT_EXCLUSIVE)

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        path = self._path(key)

        async def write(sftp: asyncssh.SFTPClient) -> bool:
            if mode.kind == "create":
                return await create_new(sftp, path, data)
            if mode.kind == "update":
                there = await self._guard.regular(sftp, path)
                found = await read_bytes(sftp, path) if there else None
                if found is None or version_of(found) != mode.version:
                    return False
            await write_bytes(sftp, path, data)
            return True

        async def checked(sftp: asyncssh.SFTPClient) -> bool:
            found = await self._guard.looked(sftp, [posixpath.dirname(path)], [path], write=True)
            if (attrs := found[path]) is not None and stat.S_ISLNK(tree.mode(attrs)):
                raise not_a_directory(self._guard.at(path), tree.mode(attrs), write=True,
                                      belongs="a regular file")
            return await _in_place(sftp, path, write)

        return await self._call(f"write {path}", checked)

    async def get(self, key: str) -> Blob | None:
        path = self._path(key)

        async def read(sftp: asyncssh.SFTPClient) -> bytes | None:
            return await read_bytes(sftp, path) if await self._guard.regular(sftp, path) else None

        data = await self._call(f"read {path}", read)
        return None if data is None else Blob(data, version_of(data))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)

        async def read(sftp: asyncssh.SFTPClient) -> bytes:
            await self._guard.regular(sftp, path)  # a missing one fails the open, as it must
            async with await sftp.open(path, "rb") as f:
                data = await f.read(max(0, end - start), start)
            return cast(bytes, data)  # opened "rb": bytes

        return await self._call(f"read {path}", read)

    async def head(self, key: str) -> ObjectMeta | None:
        path = self._path(key)

        async def stat(sftp: asyncssh.SFTPClient) -> ObjectMeta | None:
            """The regular file at ``key``; None for anything else, and through a link."""
            try:
                if not await self._guard.regular(sftp, path):
                    return None
                attrs = await sftp.lstat(path)
            except (asyncssh.SFTPNoSuchFile, IntegrityError):
                return None
            return ObjectMeta(key, attrs.size or 0, attrs.mtime)

        return await self._call(f"stat {path}", stat)

    async def list(self, prefix: str) -> list[ObjectMeta]:
        top = prefix.rpartition("/")[0]
        base = self._dir(prefix)

        async def walk(sftp: asyncssh.SFTPClient) -> list[ObjectMeta]:
            try:
                await self._guard.looked(sftp, [base], write=False)
            except IntegrityError:
                return []  # nothing through a link
            return await tree.files(sftp, self._root, top, prefix)

        return await self._call(f"list {base}", walk)

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        base = posixpath.join(self._root, check_key(prefix.rstrip("/"))) if prefix else self._root

        async def dirs(sftp: asyncssh.SFTPClient) -> builtins.list[str]:
            try:
                await self._guard.looked(sftp, [base], write=False)
            except IntegrityError:
                return []  # nothing through a link
            return await tree.dirs(sftp, base)

        return await self._call(f"list {base}", dirs)

    async def delete(self, keys: Sequence[str]) -> None:
        paths = [self._path(k) for k in keys]

        async def remove(sftp: asyncssh.SFTPClient) -> None:
            await self._guard.looked(sftp, parents(paths), write=True)
            await tree.remove_files(sftp, self._root, paths)

        if paths:
            await self._call(f"delete in {self._root}", remove)

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Store ``files``: SFTP or openssh (``concurrency`` files at once), or one rsync run
        when ``prefix`` names a directory; ``session.file_done`` as each is in place."""
        base = self._dir(prefix)
        remote = {f.path: self._path(prefix + check_relpath(f.path)) for f in files}
        dirs = parents(list(remote.values())) | {base}

        async def make(sftp: asyncssh.SFTPClient) -> None:
            await self._guard.looked(sftp, dirs, write=True)
            await makedirs(sftp, dirs)

        await self._call(f"create {base}", make)
        if self._config.transfer == "rsync" and not prefix.rpartition("/")[2]:
            await self._rsync.upload(base, root, files, session)
            return

        async def one(f: LocalFile) -> None:
            _, sha = await self._put(root / f.path, remote[f.path], f.size, session.advance)
            await session.file_done(f.path, sha)

        await fan_out(files, self._config.concurrency, one)

    async def _put(
        self, local: Path, remote: str, size: int, advance: Advance
    ) -> tuple[int, str]:
        if self._openssh:
            return await self._openssh.put(local, remote, size, advance)
        return await self._call(
            f"upload {remote}", lambda sftp: put_file(
                sftp, local, remote, temporary_name(remote, self._owner), advance))

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        remote = {f.path: self._path(prefix + check_relpath(f.path)) for f in files}

        await self._call(f"stat {self._dir(prefix)}", lambda sftp: self._guard.fetchable(
            sftp, [(remote[f.path], f.size) for f in files]))

        async def one(f: LocalFile) -> tuple[str, str]:
            try:
                _, sha = await self._get(remote[f.path], dest / f.path, f.size, advance)
            except StorageError as exc:
                if isinstance(exc, TransientStorageError) or await self._exists(remote[f.path]):
                    raise
                raise IntegrityError(
                    f"{self._link.target.host}:{remote[f.path]}: missing from the store"
                ) from exc
            return f.path, sha

        return dict(await fan_out(files, self._config.concurrency, one))

    async def _get(
        self, remote: str, local: Path, size: int, advance: Advance
    ) -> tuple[int, str]:
        """Download ``remote`` (no more than its ``size`` bytes)."""
        if self._openssh:
            return await self._openssh.get(remote, local, size, advance)
        return await self._call(
            f"download {remote}", lambda sftp: get_file(sftp, remote, local, size, advance))

    async def _exists(self, remote: str) -> bool:
        """Whether ``remote`` is there: a download that failed for lack of it is a file not
        matching its manifest, not a store that failed."""
        return await self._call(f"stat {remote}", lambda sftp: sftp.exists(remote))

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        return 0  # a partial file is written again by the next send of its checkpoint

    async def probe(self) -> None:
        """Connect, create remote_path, write and remove a file there, check the transfer
        mode's tools and the exclusive create (remembered as ``capabilities``)."""
        link = self._link
        conn = await link.connect()  # its errors already say what failed (DNS, auth, ...)
        step = "start the SFTP subsystem on"
        try:
            sftp = await conn.start_sftp_client()
            step = "create remote_path"
            await self._guard.looked(sftp, [self._root], write=True)
            await makedirs(sftp, {self._root})
            probe = posixpath.join(self._root, f".traind-probe-{secrets.token_hex(4)}")
            step = "write a file in"
            await write_bytes(sftp, probe, b"ok")
            step = "remove a file from"
            await sftp.remove(probe)
            if self._config.transfer == "rsync":
                await ssh_rsync.probe(link, conn)
            if self._openssh:
                await self._openssh.probe()
            step = "create a file exclusively in"
            exclusive = await self._exclusive(sftp)
        except (asyncssh.Error, OSError) as exc:
            raise translate(exc, link.target, f"{step} {self._root}") from exc
        finally:
            conn.abort()
        self._found(exclusive)

    async def aclose(self) -> None:
        """Close the connections (and stop the ssh processes of the openssh mode)."""
        if self._openssh:
            await self._openssh.aclose()
        await self._link.aclose()


async def _in_place(sftp: asyncssh.SFTPClient, path: str,
                    write: Callable[[asyncssh.SFTPClient], Awaitable[T]]) -> T:
    """``write(sftp)``, creating ``path``'s directory first when it is missing: one round
    trip less than making sure of it on every put."""
    try:
        return await write(sftp)
    except asyncssh.SFTPNoSuchFile:
        await makedirs(sftp, {posixpath.dirname(path)})
        return await write(sftp)

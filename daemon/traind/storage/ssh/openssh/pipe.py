"""An SFTP client over the pipes of one ``ssh`` process, blocking: the ``openssh`` mode's data path.

It runs in its connection's own worker thread, so the event loop pays nothing per packet.
Uploads read each request's worth of the local file with ``preadv`` into one reusable buffer
and hash it there (hashlib releases the GIL), then write the packet header and ``splice`` the
same file range into the pipe: the kernel hands ssh the page-cache pages just hashed, so the
data is copied once into this process, for the hash, and never through a pipe buffer, which
costs less client CPU than ``writev`` of the buffer (bench/ssh_upload.py). Downloads read
each DATA payload straight into a page-aligned staging buffer, hash it there and write whole
stages with direct I/O where the filesystem takes it (``StagedWriter``). ``REQUESTS``
requests are kept outstanding so ssh never waits for us; that cannot deadlock, because the
replies to what is outstanding always fit in the pipes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from traind.errors import StorageError, TransientStorageError
from traind.storage.base import Advance
from traind.storage.ssh.errors import sftp_error
from traind.storage.ssh.openssh import wire
from traind.util.fileio import (
    StagedWriter,
    create,
    hash_file,
    local_errors,
)

if TYPE_CHECKING:
    from hashlib import _Hash as Hash

P = ParamSpec("P")
T = TypeVar("T")

REQUESTS = 64
"""Requests outstanding per file, as OpenSSH's own sftp client keeps."""

DEFAULT_REQUEST = 32 * 1024
"""Bytes per READ/WRITE when the server states no limits: what every server must accept."""

MAX_REQUEST = 256 * 1024
"""Bytes per READ/WRITE at most, whatever the server allows (bounds the buffers)."""

NEEDED = (wire.FSYNC, wire.POSIX_RENAME)
"""Extensions the server must offer: a durable file before the rename, an atomic rename."""

_RECV = 64 * 1024
_READ = wire.OpenFlag.READ
_CREATE = wire.OpenFlag.WRITE | wire.OpenFlag.CREATE | wire.OpenFlag.TRUNCATE


class ConnectionLost(TransientStorageError):
    """The ssh process closed its pipes: the connection dropped, or never came up."""


@dataclass(frozen=True)
class Server:
    """Bytes per WRITE and per READ request to this server."""

    write: int
    read: int


class SFTPPipe:
    """SFTP v3 over a write and a read file descriptor; used by one thread at a time."""

    def __init__(self, wfd: int, rfd: int, where: str) -> None:
        self._wfd = wfd
        self._rfd = rfd
        self._where = where
        self._inbox = bytearray()
        self._last_id = 0
        self._buffer = memoryview(bytearray(DEFAULT_REQUEST))
        self.server = Server(DEFAULT_REQUEST, DEFAULT_REQUEST)

    def close(self) -> None:
        """Close both descriptors (once no thread uses them any more)."""
        os.close(self._wfd)
        os.close(self._rfd)

    def handshake(self) -> Server:
        """INIT → VERSION (which must offer the ``NEEDED`` extensions), then the server's
        limits if it states them."""
        self._send(wire.init())
        kind, _, length = wire.header(self._take(wire.HEADER))
        if kind != wire.Reply.VERSION:
            raise wire.ProtocolError(f"a packet of type {kind} instead of VERSION")
        offered = wire.extensions(self._take(length))
        missing = [name for name in NEEDED if name not in offered]
        if missing:
            raise StorageError(
                f"{self._where}: the SFTP server does not offer {', '.join(missing)}, which "
                'transfer = "openssh" needs; use transfer = "sftp"'
            )
        write = read = DEFAULT_REQUEST
        if wire.LIMITS in offered:
            limits = wire.limits(self._call("ask for limits", wire.extended(
                self._id(), wire.LIMITS), wire.Reply.EXTENDED_REPLY))
            write = min(limits.write or DEFAULT_REQUEST, MAX_REQUEST)
            read = min(limits.read or DEFAULT_REQUEST, MAX_REQUEST)
        self.server = Server(write, read)
        self._buffer = memoryview(bytearray(max(write, read)))
        return self.server

    def put(self, local: Path, remote: str, part: str, advance: Advance) -> tuple[int, str]:
        """Upload ``local`` as ``remote`` (written as ``part``, fsynced, renamed); (bytes,
        sha256)."""
        digest = hashlib.sha256()
        with local_errors("read", local):
            fd = os.open(local, os.O_RDONLY)
        try:
            handle = self._open(part, _CREATE)
            total = self._write_all(handle, fd, local, digest, advance)
        finally:
            os.close(fd)
        self._ok(f"fsync {part}", wire.extended(self._id(), wire.FSYNC, wire.string(handle)))
        self._ok(f"close {part}", wire.close(self._id(), handle))
        names = wire.string(part.encode()) + wire.string(remote.encode())
        self._ok(f"rename {part}", wire.extended(self._id(), wire.POSIX_RENAME, names))
        return total, digest.hexdigest()

    def get(self, remote: str, local: Path, most: int, advance: Advance) -> tuple[int, str]:
        """Download ``remote`` into ``local`` (not fsynced: the restore does that), no more
        than ``most`` bytes of it; (bytes, sha256)."""
        handle = self._open(remote, _READ)
        stated = wire.size(self._call(f"stat {remote}", wire.fstat(self._id(), handle),
                                      wire.Reply.ATTRS))
        if stated is None:
            raise StorageError(f"{self._where}: stat {remote}: the server did not say its size")
        size = min(stated, most)
        with local_errors("write", local):
            stage = StagedWriter(create(local, size))
        try:
            total, sha = self._read_all(handle, size, stage, local, advance)
        finally:
            stage.close()
        self._ok(f"close {remote}", wire.close(self._id(), handle))
        return total, sha

    def _write_all(
        self, handle: bytes, fd: int, local: Path, digest: Hash, advance: Advance
    ) -> int:
        buf = self._buffer[: self.server.write]
        pending: dict[int, int] = {}
        offset = 0
        while n := _local("read", local, os.preadv, fd, [buf], offset):
            digest.update(buf[:n])
            req_id = self._id()
            self._send(wire.write_header(req_id, handle, offset, n))
            self._splice(fd, offset, n, local)
            pending[req_id] = n
            offset += n
            while len(pending) >= REQUESTS:
                advance(self._ack(pending, local))
        while pending:
            advance(self._ack(pending, local))
        return offset

    def _splice(self, fd: int, offset: int, n: int, local: Path) -> None:
        """Hand ``n`` bytes of the local file at ``offset`` to the pipe: the kernel passes
        the page-cache pages just hashed, nothing is copied through this process."""
        end = offset + n
        while offset < end:
            try:
                with local_errors("read", local):  # a ConnectionError passes: the pipe's
                    moved = os.splice(fd, self._wfd, end - offset, offset_src=offset)
            except BrokenPipeError as exc:
                raise ConnectionLost(f"{self._where}: connection lost") from exc
            if not moved:
                raise StorageError(f"local file {local}: shrank while being sent")
            offset += moved

    def _ack(self, pending: dict[int, int], local: Path) -> int:
        kind, req_id, length = wire.header(self._take(wire.HEADER))
        fields = self._take(length)
        if req_id not in pending or kind != wire.Reply.STATUS:
            raise wire.ProtocolError(f"an unexpected reply (type {kind}) to a write")
        self._check(f"write {local.name}", fields)
        return pending.pop(req_id)

    def _read_all(
        self, handle: bytes, size: int, stage: StagedWriter, local: Path, advance: Advance
    ) -> tuple[int, str]:
        """Pipelined READs. Replies in order (OpenSSH's server always answers so) are
        received into a ``StagedWriter``, hashed there and written in whole stages, with direct
        I/O where the filesystem takes it. From the first reply out of order on, each
        payload is written at its offset and the file is hashed again from disk at the end,
        so the hash is always of what was written."""
        buf = self._buffer[: self.server.read]
        todo = [(offset, min(len(buf), size - offset))
                for offset in reversed(range(0, size, len(buf)))]
        pending: dict[int, tuple[int, int]] = {}
        digest, hashed, in_order, end = hashlib.sha256(), 0, True, size
        while todo or pending:
            while todo and len(pending) < REQUESTS:
                span = todo.pop()
                if span[0] < end:
                    req_id = self._id()
                    self._send(wire.read(req_id, handle, *span))
                    pending[req_id] = span
            if not pending:
                break
            kind, req_id, length = wire.header(self._take(wire.HEADER))
            if req_id not in pending:
                raise wire.ProtocolError(f"a reply to request {req_id}, which is not pending")
            offset, wanted = pending.pop(req_id)
            if kind == wire.Reply.STATUS:
                code, message = wire.status(self._take(length))
                if code != wire.Status.EOF:
                    raise self._error(f"read {local.name}", code, message)
                end = min(end, offset)  # the file shrank since FSTAT
                continue
            n = wire.data_length(self._take(4)) if kind == wire.Reply.DATA and length > 4 else 0
            if not 0 < n <= wanted or n != length - 4:
                raise wire.ProtocolError(f"an unexpected reply (type {kind}) to a read")
            in_order = in_order and offset == hashed
            if in_order:
                self._take_staged(stage, n, digest, local)
                hashed += n
            else:  # from the first reply out of order on: each at its offset
                chunk = buf[:n]
                self._take_into(chunk)
                _local("write", local, stage.write_at, chunk, offset)
            if n < wanted:  # a short read: ask for the rest
                todo.append((offset + n, wanted - n))
            advance(n)
        if in_order:
            _local("write", local, stage.finish, hashed)
            return hashed, digest.hexdigest()
        return _local("read", local, hash_file, local)

    def _take_staged(self, stage: StagedWriter, n: int, digest: Hash, local: Path) -> None:
        """Receive ``n`` in-order bytes straight into ``stage``, hashing them there and
        writing each stage as it fills."""
        while n:
            view = stage.room(n)
            self._take_into(view)
            digest.update(view)
            n -= len(view)
            _local("write", local, stage.filled, len(view))

    def _open(self, path: str, flags: int) -> bytes:
        return wire.handle(self._call(
            f"open {path}", wire.open_file(self._id(), path.encode(), flags), wire.Reply.HANDLE))

    def _ok(self, action: str, request: bytes) -> None:
        self._call(action, request, wire.Reply.STATUS)

    def _call(self, action: str, request: bytes, expect: wire.Reply) -> bytes:
        """Send one request, wait for its reply: its fields, or a StorageError."""
        self._send(request)
        kind, _, length = wire.header(self._take(wire.HEADER))
        fields = self._take(length)
        if kind == wire.Reply.STATUS:
            self._check(action, fields)
            if expect != wire.Reply.STATUS:
                raise wire.ProtocolError(f"{action}: a bare status instead of a reply")
        elif kind != expect:
            raise wire.ProtocolError(f"{action}: a packet of type {kind}")
        return fields

    def _check(self, action: str, fields: bytes) -> None:
        code, message = wire.status(fields)
        if code != wire.Status.OK:
            raise self._error(action, code, message)

    def _error(self, action: str, code: int, message: str) -> StorageError:
        error = sftp_error(self._where, action, code, message)
        if error.transient:  # ssh's stderr may say why: see OpenSSHTransfer
            return ConnectionLost(str(error), code=error.code, op=error.op)
        return error

    def _id(self) -> int:
        self._last_id = (self._last_id + 1) & 0xFFFFFFFF
        return self._last_id

    def _send(self, *parts: bytes | memoryview) -> None:
        views = [memoryview(p) for p in parts]
        while views:
            sent = _pipe(self._where, os.writev, self._wfd, views)
            while views and sent >= len(views[0]):
                sent -= len(views.pop(0))
            if views:  # a signal cut the write short
                views[0] = views[0][sent:]

    def _take(self, n: int) -> bytes:
        while len(self._inbox) < n:
            self._inbox += self._read(_RECV)
        data = bytes(self._inbox[:n])
        del self._inbox[:n]
        return data

    def _take_into(self, view: memoryview) -> None:
        have = min(len(self._inbox), len(view))
        with memoryview(self._inbox) as inbox:
            view[:have] = inbox[:have]
        del self._inbox[:have]
        while have < len(view):
            n = _pipe(self._where, os.readv, self._rfd, [view[have:]])
            if not n:
                raise ConnectionLost(f"{self._where}: connection lost")
            have += n

    def _read(self, n: int) -> bytes:
        data = _pipe(self._where, os.read, self._rfd, n)
        if not data:
            raise ConnectionLost(f"{self._where}: connection lost")
        return data


def _local(action: str, path: Path, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Local file work, translated by ``fileio.local_errors``."""
    with local_errors(action, path):
        return fn(*args, **kwargs)


def _pipe(where: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Work on ssh's pipes; its OSError means ssh is gone."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        raise ConnectionLost(f"{where}: connection lost: {exc.strerror or exc}") from exc

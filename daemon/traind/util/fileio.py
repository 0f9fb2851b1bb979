"""Blocking file helpers shared by backends: copy or read with sha256 in one pass, and the
atomic write (temporary name, fsync, rename) with the temporary names every backend uses.

They run in threads (``asyncio.to_thread``); hashlib releases the GIL on large buffers, so
several can run at once on different cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import mmap
import os
import secrets
import stat
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from traind.errors import IntegrityError, LinkedPathError, StorageError, os_error

P = ParamSpec("P")
T = TypeVar("T")

CHUNK = 4 * 1024 * 1024
WRITE_PIECE = 32 * 1024
"""Bytes per buffered write call at most (as s5cmd writes): SFTP and openssh downloads, and
local copies and S3 restores where direct writes are not taken (``direct_io``). Small
writes keep the kernel from sizing new page-cache folios by the write, which costs far more
CPU per byte for large ones (bench/README.md)."""

PART_SUFFIX = ".traind-part"
"""The ending of a file's name while it is written: renamed once whole and fsynced, so a
file with its final name is always whole (local, SFTP and openssh stores alike)."""


def temporary_name(target: str, owner: str = "") -> str:
    """The temporary name ``target`` is written under before the rename that publishes it;
    with ``owner`` (a writer's token) one no other writer uses, that its own retry reuses."""
    return f"{target}.{owner}{PART_SUFFIX}" if owner else target + PART_SUFFIX


def unique_temporary_name(target: str) -> str:
    """A temporary name for ``target`` that no other writer uses (another thread, process or
    host of a shared store): for a write that links into place rather than renaming."""
    return f"{target}.{secrets.token_hex(6)}{PART_SUFFIX}"


ALIGN = 4096
"""Offsets, lengths and buffer addresses of direct I/O are multiples of this (a page)."""
_FALLOC_FL_KEEP_SIZE = 1
_NOT_SUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def preallocate(fd: int, size: int) -> None:
    """Reserve disk space for the ``size`` bytes about to be written to ``fd``.

    A disk too full for them fails here, with ENOSPC, rather than half-way through; and
    writes into reserved blocks cost less CPU. The file's size is left alone. A filesystem
    without ``fallocate`` (NFSv3, ...) is written as it would have been: glibc's
    ``posix_fallocate`` would emulate it there by writing every block, so this calls
    ``fallocate`` itself.
    """
    call = _fallocate()
    if call is None or size <= 0:
        return
    if call(fd, _FALLOC_FL_KEEP_SIZE, 0, size) != 0:
        err = ctypes.get_errno()
        if err not in _NOT_SUPPORTED:
            raise OSError(err, os.strerror(err))


def create(path: Path, size: int) -> int:
    """Create (or truncate) ``path`` for ``size`` bytes about to be written, its directory
    too, with the space reserved (``preallocate``); return its descriptor (read-write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        preallocate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


_DIRECT_FILESYSTEMS = {0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x9123683E: "btrfs"}
"""Local block filesystems (``statfs`` magic) where direct writes are taken as they are.
Network and FUSE filesystems (NFS, SMB, Lustre, ...) handle direct I/O their own way, often
as one synchronous round trip per write, so files there are written buffered."""


def direct_io(fd: int, on: bool = True) -> bool:
    """Switch ``fd`` to direct I/O (``O_DIRECT``) or back; return whether it is now direct.

    Direct writes go from the caller's buffer to the disk, without copying into new
    page-cache pages, a copy that costs more CPU than sha256 (bench/README.md).
    They need ``ALIGN``-ed offsets, lengths and buffers (see ``write_at``). A file outside
    ``_DIRECT_FILESYSTEMS``, or one whose filesystem refuses, stays buffered (False).
    """
    if on and _filesystem(fd) not in _DIRECT_FILESYSTEMS:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError as exc:
        if exc.errno not in _NOT_SUPPORTED:
            raise
        return False
    return on


def _filesystem(fd: int) -> int:
    """The ``statfs`` magic number of the filesystem ``fd`` is on (0 if unknown)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field
    call = _libc().fstatfs
    if call(fd, buf) != 0:
        return 0
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def write_at(fd: int, buf: memoryview, length: int, offset: int, direct: bool) -> bool:
    """Write ``buf[:length]`` at ``offset``; return whether ``fd`` is still direct.

    ``direct``: ``offset`` is ``ALIGN``-ed and ``buf`` is page-aligned and long enough that
    an unaligned ``length`` goes out padded to a whole block (``trim`` cuts the file back).
    A direct write refused with EINVAL (a filesystem with stricter alignment) switches
    ``fd`` back to buffered and writes buffered.
    """
    if direct:
        padded = -(-length // ALIGN) * ALIGN
        try:
            done = 0
            while done < padded:
                done += os.pwrite(fd, buf[done:padded], offset + done)
            return True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            direct_io(fd, False)
    write_all(fd, buf[:length], offset)
    return False


def trim(fd: int, size: int) -> None:
    """Cut a file written with ``write_at`` back to its ``size`` (a padded direct tail)."""
    if os.fstat(fd).st_size != size:
        os.ftruncate(fd, size)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate``, or None where there is none."""
    try:
        call = _libc().fallocate
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    call.restype = ctypes.c_int
    return call


class SharedFd:
    """A descriptor that worker threads read or write through, closed by its owner's
    ``close`` or, if any are still running then, by the last of them.

    A cancelled task leaves its ``asyncio.to_thread`` call running; closing the descriptor
    under it could let it read or write whatever file reuses the descriptor's number.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._users = 1  # the owner, until close(); and each ``using`` block
        self._closed = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def using(self) -> Iterator[int]:
        """The descriptor, kept open for the block (refused once the owner closed it)."""
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "the transfer of this file was abandoned")
            self._users += 1
        try:
            yield self.fd
        finally:
            self._release()

    def direct_io(self) -> bool:
        """``direct_io`` on the descriptor; closes it if that fails (in a constructor)."""
        try:
            return direct_io(self.fd)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give up the descriptor: closed now, or by the last block still using it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            last = not self._users
        if last:
            os.close(self.fd)


STAGE = 4 * 1024 * 1024
"""Bytes a ``StagedWriter`` gathers before one (direct) write: a multiple of ``ALIGN``."""


class StagedWriter:
    """A file written front to back through one page-aligned buffer, a whole ``STAGE`` at a
    time at aligned offsets, so that the writes can be direct (``write_at``): no copy into
    new page-cache pages. Bytes are received straight into it (``room``, then ``filled``)
    or copied in (``write``); ``write_at`` ends the staging, for writes at any offset.

    It owns the descriptor (a ``SharedFd``): ``close`` it, also while a write is still
    running in a worker thread.
    """

    def __init__(self, fd: int) -> None:
        self._file = SharedFd(fd)
        self._view = memoryview(mmap.mmap(-1, STAGE))
        self._base = 0  # the file offset of the buffer's first byte
        self._fill = 0
        self._direct = self._file.direct_io()

    def room(self, n: int) -> memoryview:
        """Where the next (at most ``n``) bytes go."""
        return self._view[self._fill : min(STAGE, self._fill + n)]

    def filled(self, n: int) -> None:
        """``n`` bytes were put where ``room`` said; a full buffer is written out."""
        self._fill += n
        if self._fill == STAGE:
            self._flush(STAGE)
            self._base += STAGE
            self._fill = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``."""
        view = memoryview(data)
        while view:
            room = self.room(len(view))
            room[:] = view[: len(room)]
            self.filled(len(room))
            view = view[len(room) :]

    def write_at(self, data: bytes | memoryview, offset: int) -> None:
        """Write ``data`` at ``offset``, buffered; what was staged is written out first."""
        if self._fill or self._direct:
            self.flush_buffered()
        with self._file.using() as fd:
            write_all(fd, data, offset)

    def finish(self, size: int, *, durable: bool = False) -> None:
        """Write what is left (padded if direct), cut the file to ``size``, and fsync it
        when ``durable``."""
        if self._fill:
            self._flush(self._fill)
        with self._file.using() as fd:
            trim(fd, size)
            if durable:
                os.fsync(fd)

    def flush_buffered(self) -> None:
        """Write what is staged without padding, and leave the file buffered."""
        with self._file.using() as fd:
            if self._direct:
                self._direct = direct_io(fd, False)
            write_all(fd, self._view[: self._fill], self._base)
        self._base += self._fill
        self._fill = 0

    def close(self) -> None:
        """Give up the descriptor (``SharedFd.close``)."""
        self._file.close()

    def _flush(self, n: int) -> None:
        with self._file.using() as fd:
            self._direct = write_at(fd, self._view, n, self._base, self._direct)


def copy_hashed(
    src: Path, dst: Path, advance: Callable[[int], None], *, durable: bool = True,
    size: int | None = None, abandoned: threading.Event | None = None,
) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` through a ``StagedWriter`` (direct writes where the
    filesystem takes it), hashing while reading; fsync it when ``durable`` (a restore
    leaves that to its caller, which makes the whole tree durable at once). With ``size``
    (a stored file fetched for its manifest) ``src`` is opened by ``open_regular`` and no
    more than ``size`` bytes are read. Once ``abandoned`` is set (``abandonable``) the
    copy stops at the next chunk.

    Returns (bytes, sha256 hex).
    """
    digest = hashlib.sha256()
    total = 0
    fd = os.open(src, os.O_RDONLY) if size is None else open_regular(src, size)
    with open(fd, "rb", buffering=0) as fin:
        cap = os.fstat(fd).st_size if size is None else size
        out = StagedWriter(create(dst, cap))
        if size is None:
            cap = sys.maxsize  # to its end, however long: our own file
        try:
            while total < cap and (n := fin.readinto(room := out.room(min(STAGE, cap - total)))):
                if abandoned is not None and abandoned.is_set():
                    raise OSError(errno.ECANCELED, "the copy was abandoned", str(src))
                digest.update(room[:n])
                out.filled(n)
                total += n
                advance(n)
            out.finish(total, durable=durable)
        finally:
            out.close()
    return total, digest.hexdigest()


_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory",
          stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFREG: "a regular file"}


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (an ``st_mode``, an SFTP ``permissions``) is, for a message."""
    return _KINDS.get(stat.S_IFMT(mode), "of an unknown type")


def not_regular(where: object, mode: int) -> IntegrityError:
    """The error for a stored file that is not a regular file: that checkpoint's corruption,
    as a flipped byte is; it is never read (a FIFO would block, a link to ``/dev/zero``
    never end)."""
    return IntegrityError(f"{where} is {file_kind(mode)}, not a regular file: not read")


def not_a_directory(where: object, mode: int, *, write: bool,
                    belongs: str = "a directory") -> StorageError:
    """The error for a path in a store that is ``mode`` (a link, say) where ``belongs``
    belongs: nothing is written through it (LinkedPathError), nor read (IntegrityError: the
    checkpoint's corruption)."""
    if write:
        return LinkedPathError(f"{where} is {file_kind(mode)}, not {belongs}: traind writes "
                               "nothing through it, nor reads through the run's own "
                               "directory")
    return IntegrityError(f"{where} is {file_kind(mode)}, not {belongs}: not read through")


def size_differs(where: object, size: int, expected: int) -> IntegrityError:
    """The error for a stored file whose size is not its manifest's (found before reading)."""
    return IntegrityError(f"{where}: size {size} != manifest {expected}")


def open_regular(path: Path, size: int | None = None) -> int:
    """A read-only descriptor on the stored file ``path``, opened without blocking and
    without following a final link; one that is not a regular file (of ``size`` bytes,
    when given) raises IntegrityError naming it (``not_regular``, ``size_differs``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise not_regular(path, stat.S_IFLNK) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        if size is not None and st.st_size != size:
            raise size_differs(path, st.st_size, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int | None = None) -> None:
    """Write ``data`` to ``fd`` (at ``offset``, else at its position) in ``WRITE_PIECE``s."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        piece = view[done : done + WRITE_PIECE]
        done += os.write(fd, piece) if offset is None else os.pwrite(fd, piece, offset + done)


def hash_file(path: Path) -> tuple[int, str]:
    """Return (size, sha256 hex) of a file, read once in large chunks."""
    digest = hashlib.sha256()
    total = 0
    for chunk in iter_chunks(path):
        digest.update(chunk)
        total += len(chunk)
    return total, digest.hexdigest()


def iter_chunks(
    path: Path, size: int = CHUNK, offset: int = 0
) -> Generator[bytes, None, None]:
    """Yield a file's bytes from ``offset`` in chunks of ``size``."""
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while chunk := f.read(size):
            yield chunk


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(target: Path, data: bytes) -> None:
    """Write ``target`` (and its directory) whole: temporary name, fsync, rename, and the
    directory fsynced, so that a crash leaves the old file or the new one, never a part."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(unique_temporary_name(target.name))  # two writers never share it
    try:
        _write_synced(part, data)
        os.replace(part, target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def create_exclusive(target: Path, data: bytes) -> bool:
    """Create ``target`` holding ``data`` unless it exists; return whether this call made it.

    Written whole under a unique temporary name, fsynced, then hard-linked into place:
    ``link`` fails atomically when the name exists (on NFS too, unlike ``O_EXCL`` on old
    servers), so of two racing writers exactly one wins and no reader sees a partial file.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(unique_temporary_name(target.name))
    try:
        _write_synced(part, data)
        try:
            os.link(part, target)
        except FileExistsError:
            return False
    finally:
        part.unlink(missing_ok=True)
    fsync_dir(target.parent)
    return True


@contextlib.contextmanager
def local_errors(action: str, path: object = None) -> Iterator[None]:
    """Local file work inside it fails with a (not retried) StorageError naming the file
    (``errors.os_error``) instead of an OSError; a ConnectionError is the network's, and
    passes as it is."""
    try:
        yield
    except ConnectionError:
        raise
    except OSError as exc:
        raise os_error(exc, action, path) from exc


async def abandonable(
    action: str, path: object, fn: Callable[Concatenate[threading.Event, P], T],
    *args: P.args, **kwargs: P.kwargs,
) -> T:
    """``in_thread`` for long work that stops once the event it is passed first is set: set
    when the caller is cancelled, which then waits the step it takes the worker thread to
    stop, so the thread neither runs on (a stopping daemon's exit waits for its threads)
    nor writes after its caller has moved on (and removed what it was writing into)."""
    abandoned = threading.Event()
    work = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(fn, abandoned, *args, **kwargs))
    with local_errors(action, path):
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            abandoned.set()
            await asyncio.wait([work])
            if not work.cancelled():
                work.exception()  # the abandoned copy's error: taken, never reported
            raise


async def in_thread(
    action: str, path: object, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """Run blocking local file work in a worker thread, its OSError translated as by
    ``local_errors``."""
    with local_errors(action, path):
        return await asyncio.to_thread(fn, *args, **kwargs)

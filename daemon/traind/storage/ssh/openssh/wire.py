"""SFTP version 3 on the wire: packets built and taken apart, no I/O.

The subset the ``openssh`` transfer mode speaks (draft-ietf-secsh-filexfer-02), plus the
OpenSSH extensions it relies on (``PROTOCOL`` in OpenSSH's source): ``fsync@openssh.com``,
``posix-rename@openssh.com`` and ``limits@openssh.com``. Every packet is
``uint32 length, byte type, uint32 request id, fields...``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from traind.errors import StorageError

VERSION = 3
FSYNC = "fsync@openssh.com"
POSIX_RENAME = "posix-rename@openssh.com"
LIMITS = "limits@openssh.com"

HEADER = 9
"""Bytes before a packet's fields: length (which counts what follows it), type, request id."""

MAX_PACKET = 256 * 1024 + 1024
"""Largest reply accepted: OpenSSH's sftp-server sends at most 256 KiB of fields."""

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">IBI")
_LIMITS = struct.Struct(">QQQQ")
_NO_ATTRS = _U32.pack(0)
_ATTR_SIZE = 0x1


class Op(IntEnum):
    """Request packet types."""

    INIT = 1
    OPEN = 3
    CLOSE = 4
    READ = 5
    WRITE = 6
    FSTAT = 8
    EXTENDED = 200


class Reply(IntEnum):
    """Reply packet types."""

    VERSION = 2
    STATUS = 101
    HANDLE = 102
    DATA = 103
    ATTRS = 105
    EXTENDED_REPLY = 201


class Status(IntEnum):
    """Codes of a STATUS reply."""

    OK = 0
    EOF = 1
    NO_SUCH_FILE = 2
    PERMISSION_DENIED = 3
    FAILURE = 4
    BAD_MESSAGE = 5
    NO_CONNECTION = 6
    CONNECTION_LOST = 7
    OP_UNSUPPORTED = 8


class OpenFlag(IntEnum):
    """``pflags`` of OPEN."""

    READ = 0x01
    WRITE = 0x02
    CREATE = 0x08
    TRUNCATE = 0x10


class ProtocolError(StorageError):
    """A packet that does not parse: the stream is not (or no longer) SFTP."""


@dataclass(frozen=True)
class Limits:
    """The server's ``limits@openssh.com`` answer; 0 means not stated."""

    packet: int
    read: int
    write: int
    handles: int


def string(data: bytes) -> bytes:
    """An SFTP string: uint32 length, then the bytes."""
    return _U32.pack(len(data)) + data


def packet(op: Op, req_id: int, *fields: bytes) -> bytes:
    """A whole request packet."""
    body = b"".join(fields)
    return _HEAD.pack(len(body) + 5, op, req_id) + body


def init() -> bytes:
    """INIT: the version sits where other packets have their request id."""
    return _HEAD.pack(5, Op.INIT, VERSION)


def open_file(req_id: int, path: bytes, flags: int) -> bytes:
    """OPEN ``path`` with ``flags`` and no attributes (the server's umask applies)."""
    return packet(Op.OPEN, req_id, string(path), _U32.pack(flags), _NO_ATTRS)


def close(req_id: int, handle: bytes) -> bytes:
    """CLOSE a handle."""
    return packet(Op.CLOSE, req_id, string(handle))


def fstat(req_id: int, handle: bytes) -> bytes:
    """FSTAT an open handle."""
    return packet(Op.FSTAT, req_id, string(handle))


def read(req_id: int, handle: bytes, offset: int, length: int) -> bytes:
    """READ ``length`` bytes at ``offset``."""
    return packet(Op.READ, req_id, string(handle), _U64.pack(offset), _U32.pack(length))


def write_header(req_id: int, handle: bytes, offset: int, length: int) -> bytes:
    """A WRITE packet up to its data: the caller sends ``length`` bytes of data right after
    it, from its own buffer (no copy into the packet)."""
    fields = string(handle) + _U64.pack(offset) + _U32.pack(length)
    return _HEAD.pack(len(fields) + length + 5, Op.WRITE, req_id) + fields


def extended(req_id: int, name: str, *fields: bytes) -> bytes:
    """An EXTENDED request ``name`` with its own fields."""
    return packet(Op.EXTENDED, req_id, string(name.encode()), *fields)


def header(head: bytes) -> tuple[int, int, int]:
    """(type, request id, bytes of fields that follow) from a packet's first HEADER bytes."""
    length, kind, req_id = _HEAD.unpack(head)
    if not 5 <= length <= MAX_PACKET:
        raise ProtocolError(f"a packet of {length} bytes")
    return kind, req_id, length - 5


class Fields:
    """A cursor over a reply's fields; running past the end is a ProtocolError."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def _take(self, n: int) -> bytes:
        end = self._at + n
        if end > len(self._data):
            raise ProtocolError("a packet ends early")
        chunk, self._at = self._data[self._at : end], end
        return chunk

    def u32(self) -> int:
        """The next uint32."""
        value: int = _U32.unpack(self._take(4))[0]
        return value

    def u64(self) -> int:
        """The next uint64."""
        value: int = _U64.unpack(self._take(8))[0]
        return value

    def string(self) -> bytes:
        """The next string."""
        return self._take(self.u32())

    def done(self) -> bool:
        """Whether every field has been read."""
        return self._at >= len(self._data)


def extensions(fields: bytes) -> dict[str, bytes]:
    """The name → data pairs a VERSION reply advertises."""
    cursor = Fields(fields)
    found: dict[str, bytes] = {}
    while not cursor.done():
        name = cursor.string().decode(errors="replace")
        found[name] = cursor.string()
    return found


def status(fields: bytes) -> tuple[int, str]:
    """(code, message) of a STATUS reply; the message is optional in old servers."""
    cursor = Fields(fields)
    code = cursor.u32()
    message = "" if cursor.done() else cursor.string().decode(errors="replace")
    return code, message or _name(code)


def handle(fields: bytes) -> bytes:
    """The handle of a HANDLE reply."""
    return Fields(fields).string()


def size(fields: bytes) -> int | None:
    """The size an ATTRS reply states, if it states one."""
    cursor = Fields(fields)
    return cursor.u64() if cursor.u32() & _ATTR_SIZE else None


def limits(fields: bytes) -> Limits:
    """The four limits of a ``limits@openssh.com`` reply."""
    if len(fields) < _LIMITS.size:
        raise ProtocolError("a limits reply ends early")
    return Limits(*_LIMITS.unpack_from(fields))


def data_length(fields: bytes) -> int:
    """The payload length at the start of a DATA reply's fields."""
    value: int = _U32.unpack(fields)[0]
    return value


def _name(code: int) -> str:
    try:
        return Status(code).name.lower().replace("_", " ")
    except ValueError:
        return f"status {code}"

"""The SFTP v3 codec of the openssh transfer mode: packets as the draft and OpenSSH lay them out."""

from __future__ import annotations

import struct

import pytest

from traind.storage.ssh.openssh import wire


def _split(packet: bytes) -> tuple[int, int, wire.Fields]:
    """(type, request id, fields) of a whole packet, checking its length field."""
    kind, req_id, length = wire.header(packet[: wire.HEADER])
    assert length == len(packet) - wire.HEADER
    return kind, req_id, wire.Fields(packet[wire.HEADER :])


def test_init_carries_the_version_where_others_carry_an_id() -> None:
    """INIT is length 5, type 1, version 3."""
    assert wire.init() == b"\x00\x00\x00\x05\x01\x00\x00\x00\x03"


def test_open_read_close_fstat_encode_their_fields() -> None:
    """Each request is type, id, then its fields in the draft's order."""
    kind, req_id, fields = _split(wire.open_file(7, b"/a/b.part", 0x1A))
    assert (kind, req_id) == (wire.Op.OPEN, 7)
    assert (fields.string(), fields.u32(), fields.u32()) == (b"/a/b.part", 0x1A, 0)
    assert fields.done()

    kind, req_id, fields = _split(wire.read(8, b"h1", 2**33, 261120))
    assert (kind, req_id) == (wire.Op.READ, 8)
    assert (fields.string(), fields.u64(), fields.u32()) == (b"h1", 2**33, 261120)

    for build, op in ((wire.close, wire.Op.CLOSE), (wire.fstat, wire.Op.FSTAT)):
        kind, req_id, fields = _split(build(9, b"h1"))
        assert (kind, req_id, fields.string()) == (op, 9, b"h1")
        assert fields.done()


def test_write_header_announces_the_data_sent_after_it() -> None:
    """A WRITE header plus the caller's data is exactly one well-formed WRITE packet."""
    data = bytes(range(256)) * 3
    kind, req_id, fields = _split(wire.write_header(5, b"hdl", 4096, len(data)) + data)
    assert (kind, req_id) == (wire.Op.WRITE, 5)
    assert (fields.string(), fields.u64(), fields.string()) == (b"hdl", 4096, data)
    assert fields.done()


def test_extended_requests_name_the_extension() -> None:
    """posix-rename carries the extension name, then both paths."""
    names = wire.string(b"/x.part") + wire.string(b"/x")
    kind, req_id, fields = _split(wire.extended(3, wire.POSIX_RENAME, names))
    assert (kind, req_id) == (wire.Op.EXTENDED, 3)
    assert [fields.string(), fields.string(), fields.string()] == [
        b"posix-rename@openssh.com", b"/x.part", b"/x"]


def test_version_extensions_and_limits_decode() -> None:
    """VERSION lists name/data pairs; limits@openssh.com is four uint64s."""
    offered = (wire.string(wire.FSYNC.encode()) + wire.string(b"1")
               + wire.string(wire.LIMITS.encode()) + wire.string(b"1"))
    assert wire.extensions(offered) == {wire.FSYNC: b"1", wire.LIMITS: b"1"}
    assert wire.extensions(b"") == {}
    reply = struct.pack(">QQQQ", 262144, 261120, 261120, 1024)
    assert wire.limits(reply) == wire.Limits(262144, 261120, 261120, 1024)
    with pytest.raises(wire.ProtocolError):
        wire.limits(reply[:20])


def test_status_handle_attrs_and_data_decode() -> None:
    """STATUS (message optional), HANDLE, ATTRS with or without a size, DATA's length."""
    full = struct.pack(">I", 3) + wire.string(b"Permission denied") + wire.string(b"")
    assert wire.status(full) == (3, "Permission denied")
    assert wire.status(struct.pack(">I", 1)) == (1, "eof")
    assert wire.status(struct.pack(">I", 42)) == (42, "status 42")
    assert wire.handle(wire.string(b"\x00\x01")) == b"\x00\x01"
    assert wire.size(struct.pack(">IQI", 0x1, 12345, 0o644)) == 12345
    assert wire.size(struct.pack(">II", 0x4, 0o644)) is None
    assert wire.data_length(struct.pack(">I", 261120)) == 261120


@pytest.mark.parametrize(
    "head",
    [
        b"Welcome to", b"\x00\x00\x00\x04\x65\x00\x00\x00\x01",
        struct.pack(">IBI", wire.MAX_PACKET + 1, wire.Reply.DATA, 1),
    ],
)
def test_a_garbled_stream_is_a_protocol_error(head: bytes) -> None:
    """A login banner, a too-short or a huge length is not taken for a packet."""
    with pytest.raises(wire.ProtocolError):
        wire.header(head[: wire.HEADER].ljust(wire.HEADER, b" "))


def test_fields_never_read_past_the_packet() -> None:
    """A string longer than what is left is a ProtocolError, not a short read."""
    fields = wire.Fields(struct.pack(">I", 10) + b"short")
    with pytest.raises(wire.ProtocolError):
        fields.string()
    with pytest.raises(wire.ProtocolError):
        wire.Fields(b"\x00\x00").u32()

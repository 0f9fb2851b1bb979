"""The store interface: the few primitives every backend implements, nothing more.

Modelled on Apache Arrow's ``object_store``: ``put`` with a mode (overwrite, create-only,
replace-if-version), ``get`` whole or by range, ``head``, ``list`` by prefix, ``delete``,
plus the bulk ``send``/``fetch`` of checkpoint files that each backend does its fastest
way. Keys are relative to the run's root (``<tag>/<path>``); the backend maps them onto its
``<prefix>/<run>/``. Claims, leases, commits, parts and the resume agreement are written
once above this, in ``traind.protocol``; ``Capabilities`` says which guarantees the
protocol may lean on and which it must make up for.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

Advance = Callable[[int], None]
"""Progress callback: called with the number of bytes just moved (thread-safe, cheap)."""


class Counted:
    """An ``Advance`` that remembers how much it reported, to take it back on failure."""

    def __init__(self, advance: Advance) -> None:
        self._advance = advance
        self.moved = 0

    def __call__(self, nbytes: int) -> None:
        self.moved += nbytes
        self._advance(nbytes)

    def rewind(self) -> None:
        """Report the bytes counted so far as not moved after all."""
        self._advance(-self.moved)
        self.moved = 0


@contextlib.contextmanager
def counted(advance: Advance) -> Iterator[Counted]:
    """Count what the block reports through ``advance``; take it back if the block fails,
    so that a retry does not count the same bytes twice."""
    tally = Counted(advance)
    try:
        yield tally
    except BaseException:
        tally.rewind()
        raise


@dataclass(frozen=True)
class LocalFile:
    """A file to upload: its path relative to the checkpoint root, and its size."""

    path: str
    size: int


class UploadSession(Protocol):
    """What the streamer hands a backend for one checkpoint upload (backed by the journal).

    ``file_done`` must be awaited once per file, as soon as the file is durably stored, so
    a restarted daemon skips it. ``load_state``/``save_state`` keep opaque per-file resume
    state (an S3 multipart upload id and its finished parts, say).
    """

    def advance(self, nbytes: int) -> None: ...

    async def file_done(self, path: str, sha256: str) -> None: ...

    async def load_state(self, path: str) -> str | None: ...

    async def save_state(self, path: str, state: str) -> None: ...


@dataclass(frozen=True)
class PutMode:
    """How ``put`` treats an object already at the key: ``overwrite`` it; ``create`` only
    when there is none; ``update`` only while it still has ``version`` (compare-and-swap)."""

    kind: Literal["overwrite", "create", "update"]
    version: str | None = None


OVERWRITE = PutMode("overwrite")
CREATE = PutMode("create")


def update(version: str) -> PutMode:
    """The mode that replaces an object only while it is still at ``version``."""
    return PutMode("update", version)


@dataclass(frozen=True)
class Blob:
    """A small object as read: its bytes and the version ``update`` compares against."""

    data: bytes
    version: str


@dataclass(frozen=True)
class ObjectMeta:
    """One listed object: its key (relative to the run's root), size and, where the store
    says, when it was last written (seconds since the epoch)."""

    key: str
    size: int
    modified: float | None = None
    sha256: str | None = None
    """The store's own record of the content's sha256, where it keeps one (the Hub's LFS
    files): what a checkpoint another tool wrote is verified against."""


@dataclass(frozen=True)
class Capabilities:
    """What the store guarantees (OpenDAL's capability flags): ``create`` — a create-only
    put lets exactly one of two racing writers through; ``update`` — a replace-if-version put
    is an atomic compare-and-swap. Where a flag is False the put is still made, as a read
    then a write, and the protocol makes up for it (claims by listing, see
    ``protocol/listing_claims.py``)."""

    create: bool
    update: bool
    claim: str
    """How a tag stays one writer's on this store, in a sentence (``traind check-config``)."""
    atomic_delete: bool = False
    """Whether one ``delete`` of many keys is one atomic change (a Hub commit): then a
    checkpoint is deleted in one call, not manifest first and claims last."""
    staged: bool = False
    """Whether ``send`` only stages files, to become visible with the checkpoint's manifest
    in one atomic change (``StagingStore.publish``, a Hub commit): the commit then decides
    whose a tag is, and a checkpoint costs that one change."""


class ObjectStore(Protocol):
    """A store of objects under one run's root: local, S3, SSH, memory."""

    @property
    def describe(self) -> str:
        """A short, secret-free identity such as ``s3://bucket/prefix/run/`` (logs, journal)."""
        ...

    def where(self, key: str) -> str:
        """Where ``key`` is, for a message (``s3://bucket/prefix/run/<key>``, a path)."""
        ...

    async def capabilities(self) -> Capabilities:
        """What this store guarantees (found on first need, then remembered)."""
        ...

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        """Store the small object ``data`` at ``key`` whole (never half-written); return
        False when ``mode`` refused it: ``create`` found an object there, ``update`` found
        another version or none."""
        ...

    async def get(self, key: str) -> Blob | None:
        """The small object at ``key`` with its version, None when there is none."""
        ...

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the object at ``key``; fewer at its
        end. A missing object is a StorageError whose ``missing`` is true."""
        ...

    async def head(self, key: str) -> ObjectMeta | None:
        """The object at ``key`` as listed, None when there is none."""
        ...

    async def list(self, prefix: str) -> list[ObjectMeta]:
        """Every object whose key starts with ``prefix`` (a ``<tag>/`` or a name's start),
        at any depth, in no particular order; nothing when there is none."""
        ...

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The names of the "directories" directly under ``prefix`` (``""``: the run's
        tags and reserved directories), sorted."""
        ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Remove ``keys`` (batched where the store can); missing ones are no error."""

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Store ``files`` (relative to ``root``) at ``prefix + path``, the store's fastest
        way (S3 multipart, one rsync run, parallel SFTP), sha256 computed while reading;
        ``session.file_done`` as each file is durably in place."""

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        """Write each of ``files`` from ``prefix + path`` to ``dest / path``; return path →
        sha256 of what was written. One missing from the store raises IntegrityError."""
        ...

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        """Remove what interrupted sends under ``prefix`` left behind that none of the resume
        states ``keep`` (the journal's, opaque) continue — S3's multipart uploads; return
        how many (0 on stores where a partial file is simply written again)."""
        ...

    async def probe(self) -> None:
        """Check the store is reachable and writable; raise StorageError saying what fails."""

    async def aclose(self) -> None:
        """Release connections."""


@runtime_checkable
class StagingStore(ObjectStore, Protocol):
    """A store whose ``send`` stages files and whose one atomic change makes them visible
    with a small object (``Capabilities.staged``): the Hub, where it is one commit."""

    async def publish(self, prefix: str, files: Sequence[LocalFile], note: str, *,
                      key: str | None = None, data: bytes = b"", mode: PutMode = CREATE,
                      unless: str | None = None) -> bool:
        """Make every one of ``files`` staged under ``prefix`` visible, with ``data`` at
        ``key`` when given (as ``put`` with ``mode``), in one atomic change described by
        ``note``; return False, changing nothing, when ``mode`` refuses it or an object
        whose key starts with ``unless`` exists. Each of ``files`` must be staged by this
        handle or stored already with its size, and the store is asked that the staged
        bytes are there: MissingFilesError names those that are not."""
        ...

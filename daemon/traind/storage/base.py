"""The storage Protocol every backend implements, and the upload session it is handed.

A backend stores files under ``<prefix>/<run>/<tag>/<path>`` and the manifest at
``<prefix>/<run>/<tag>/traind-manifest.json``. A checkpoint exists only when its manifest
does: ``manifests()`` lists manifests only, ``delete()`` removes the manifest first. A tag
belongs to one writer: ``claim()`` takes it (``traind-writer.json``) before any data goes
out, with the store's atomic create, and ``delete()`` removes the claim last. The claim is
a lease its writer renews while uploading; a stale one (its writer died) is taken over.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from traind.layout.manifest import Manifest, Writer
from traind.layout.parts import Part
from traind.storage.claim import Lease

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


class Storage(Protocol):
    """A checkpoint store. Implementations: local.py, s3.py, ssh.py, memory.py."""

    @property
    def describe(self) -> str:
        """A short, secret-free identity such as ``s3://bucket/prefix`` (logs, journal)."""
        ...

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Store ``files`` (relative to ``root``) under ``tag``, sha256 computed while reading."""

    async def claim(self, tag: str, writer: Writer) -> None:
        """Take ``tag`` for ``writer`` before any of its data goes out, atomically: of two
        writers racing, one gets it. Held (or committed) by ``writer`` already: nothing to
        do; by another writer: raise ConflictError."""

    async def renew(self, tag: str, writer: Writer) -> None:
        """Renew ``writer``'s claim on ``tag`` (a lease, see storage/claim.py): the holder
        does so while it uploads. Raise ConflictError when it is not ``writer``'s any more
        (taken over as stale, or removed): this writer lost the tag."""

    async def release(self, tag: str, writer: Writer) -> None:
        """Mark ``writer``'s claim on ``tag`` stale at once (a shutdown that could not commit
        it), so the next writer takes it over without waiting; another's is left alone."""

    async def take_over(self, tag: str, stale: Lease, writer: Writer) -> bool:
        """Remove the stale claim ``stale`` on ``tag`` and every object of its uncommitted
        upload, for ``writer`` to claim next; return False when another writer is taking it
        over (an atomic create of ``stale.marker`` lets one through) or it was renewed."""

    async def commit(self, manifest: Manifest) -> None:
        """Write the manifest, never over one already there (unless its writer is this
        manifest's, a retried commit): after this the checkpoint exists."""

    async def manifests(self) -> list[Manifest]:
        """Every committed checkpoint of this run, in no particular order."""
        ...

    async def download(self, manifest: Manifest, dest: Path, advance: Advance) -> dict[str, str]:
        """Fetch every file of ``manifest`` under ``dest``; return path → sha256 of what was
        written (computed while writing). The caller verifies and renames. A file missing
        from the store raises IntegrityError (the checkpoint does not match its manifest)."""
        ...

    async def delete(self, tag: str) -> None:
        """Remove a checkpoint: manifest first, then its files. Missing is not an error."""

    async def probe(self) -> str:
        """Check the store is reachable and writable; raise StorageError saying what fails.
        Return how ``claim`` makes a tag one writer's on this store (for check-config)."""
        ...

    async def cleanup(self, resume_states: Collection[str]) -> int:
        """Remove what interrupted uploads left in the store that none of ``resume_states``
        (the journal's, opaque) can continue — S3's abandoned multipart uploads, say;
        return how many things were removed."""
        ...

    async def aclose(self) -> None:
        """Release connections."""


@runtime_checkable
class PartStore(Protocol):
    """What a backend adds for multi-node runs (``[run] nodes > 1``): each host claims,
    uploads and describes its own part of a tag; the union is committed with ``commit``."""

    async def claim_part(self, tag: str, rank: int, writer: Writer) -> None:
        """Take node ``rank``'s part of ``tag`` for ``writer``, atomically; ConflictError when
        another writer holds that part, or a single writer holds the whole tag."""

    async def part_claim(self, tag: str, rank: int) -> Writer | None:
        """Who holds node ``rank``'s part of ``tag``; None when nobody (never claimed, or
        the checkpoint was deleted since)."""
        ...

    async def upload_part(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        """Like ``upload``, but never over another host's file: a path stored already is
        kept when its bytes are these, and PartsDisagreeError when they differ."""

    async def commit_part(self, part: Part) -> None:
        """Write ``part``'s manifest beside its files (after every file is stored)."""

    async def part_ranks(self, tag: str) -> set[int]:
        """The node ranks whose part manifest of ``tag`` is stored: names only, one listing
        (every host asks once per checkpoint; only the one completing the set reads them)."""
        ...

    async def parts(self, tag: str) -> list[Part]:
        """Every part manifest stored for ``tag``, in no particular order."""
        ...

    async def uncommitted(self) -> dict[str, list[Part]]:
        """Every tag of this run holding part manifests and no manifest, with its parts:
        node 0 looks for checkpoints whose parts never all arrive (a host died for good)."""
        ...

    async def committed(self, tag: str) -> Manifest | None:
        """The manifest of ``tag`` when it is committed: one small read, how a host whose
        part waits learns that the last part's host committed the union."""
        ...


@runtime_checkable
class AgreementStore(Protocol):
    """What a backend adds for a multi-node job's resume point (checkpoints/agreement.py):
    each host's start request and node 0's board, beside the tags under
    ``.traind-resume/``."""

    async def request_start(self, rank: int, nonce: str) -> None:
        """Store node ``rank``'s start request ``nonce``, replacing its last one."""

    async def withdraw_start(self, rank: int, nonce: str) -> None:
        """Remove node ``rank``'s start request while it is still ``nonce`` (a host stopping
        before its trainer started)."""

    async def start_requests(self) -> dict[int, str]:
        """Every node's start request, rank → nonce, from one listing (node 0's poll)."""
        ...

    async def write_board(self, data: bytes) -> None:
        """Replace the resume board (written by node 0 alone)."""

    async def read_board(self) -> bytes | None:
        """The resume board, None before node 0 wrote one: one small read (every host's
        poll)."""
        ...

"""The checkpoint store every caller uses: the protocol's verbs over one ``ObjectStore``.

Claims, commits, parts and the resume agreement are each written once (``claims``,
``commit``, ``parts``, ``resume``); this class only binds them to a store, so a new
backend is a handful of primitives and nothing of this.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from traind.config import AnyStorage
from traind.layout.keys import check_tag
from traind.layout.manifest import Manifest, Writer
from traind.layout.parts import Part
from traind.protocol import claims, commit, parts, resume
from traind.protocol import trainer_pushed as foreign
from traind.protocol.commit import Listing
from traind.protocol.ownership import Lease
from traind.storage import Advance, LocalFile, ObjectStore, UploadSession, open_objects

CONCURRENCY = 16
"""Small reads at once (manifests, parts) where the store's config says nothing."""


class CheckpointStore:
    """Checkpoints of ``run`` in ``objects`` (the store under that run's root): claim,
    send, commit, list, fetch, delete."""

    def __init__(self, objects: ObjectStore, run: str, concurrency: int = CONCURRENCY,
                 foreign: ObjectStore | None = None) -> None:
        self.objects = objects
        self.run = run
        self._concurrency = concurrency
        self._foreign = foreign
        """Where another tool's checkpoints may be (the Hub repo's root, for HF Trainer's
        push): listed and restored, never written; None where there is no such place."""

    @property
    def describe(self) -> str:
        """A short, secret-free identity of the store (logs, journal)."""
        return self.objects.describe

    async def upload(self, tag: str, root: Path, files: Sequence[LocalFile],
                     session: UploadSession) -> None:
        """Store ``files`` (relative to ``root``) under ``tag``, sha256 computed while
        reading; ``session.file_done`` as each is in place."""
        await self.objects.send(f"{check_tag(tag)}/", root, files, session)

    async def claim(self, tag: str, writer: Writer) -> None:
        """Take ``tag`` for ``writer`` before any of its data goes out (``claims.claim``)."""
        await claims.claim(self.objects, self.run, tag, writer)

    async def renew(self, tag: str, writer: Writer) -> None:
        """Renew ``writer``'s claim; ConflictError once it is not its own."""
        await claims.renew(self.objects, tag, writer)

    async def release(self, tag: str, writer: Writer) -> None:
        """Mark ``writer``'s claim stale at once; another's is left alone."""
        await claims.release(self.objects, tag, writer)

    async def take_over(self, tag: str, stale: Lease, writer: Writer) -> bool:
        """Take the stale claim over, removing its writer's objects (``claims.take_over``)."""
        return await claims.take_over(self.objects, tag, stale, writer)

    async def commit(self, manifest: Manifest) -> None:
        """Check every file is stored, then write the manifest: the checkpoint exists."""
        await commit.commit(self.objects, self.run, manifest)

    async def commit_union(self, manifest: Manifest) -> None:
        """Commit the union of a multi-node job's parts (``parts.union``) as its manifest."""
        await commit.commit(self.objects, self.run, manifest, union=True)

    async def manifests(self) -> list[Manifest]:
        """Every committed checkpoint of this run, in no particular order."""
        return (await self.listing()).manifests

    async def listing(self) -> Listing:
        """Every committed checkpoint, and every manifest found unreadable."""
        return await commit.listing(self.objects, self.run, self._concurrency)

    async def foreign_manifests(self) -> list[Manifest]:
        """Checkpoints HF Trainer pushed itself (no traind manifest), as manifests of this
        run, whose tag no committed checkpoint has: for ``traind list`` and ``pull``, never
        pruned."""
        if self._foreign is None:
            return []
        ours = {m.tag for m in await self.manifests()}
        return [m for m in await foreign.trainer_checkpoints(
            self._foreign, self.run, self._concurrency) if m.tag not in ours]

    async def committed(self, tag: str) -> Manifest | None:
        """The manifest of ``tag`` when it is committed: one small read."""
        return await commit.read_manifest(self.objects, self.run, tag)

    async def download(self, manifest: Manifest, dest: Path, advance: Advance) -> dict[str, str]:
        """Fetch every file of ``manifest`` under ``dest``; return path → sha256 as written
        (the caller verifies and renames). A file missing from the store: IntegrityError."""
        files = commit.local_files(manifest.files)
        source = self.objects
        if self._foreign is not None and manifest.writer is None:
            source = self._foreign  # HF Trainer's own push, at the repo's root
        return await source.fetch(f"{check_tag(manifest.tag)}/", files, dest, advance)

    async def delete(self, tag: str) -> None:
        """Remove a checkpoint: manifest first, then its files, claims last."""
        await commit.delete(self.objects, tag)

    async def probe(self) -> str:
        """Check the store is reachable and writable (StorageError saying what fails);
        return how a tag stays one writer's on it."""
        await self.objects.probe()
        return (await self.objects.capabilities()).claim

    async def cleanup(self, resume_states: Collection[str]) -> int:
        """Remove what interrupted uploads left that none of ``resume_states`` continue."""
        return await self.objects.abort_uploads("", resume_states)

    async def aclose(self) -> None:
        """Release connections."""
        await self.objects.aclose()
        if self._foreign is not None:
            await self._foreign.aclose()

    # -- multi-node: parts and the resume agreement ------------------------------------

    async def claim_part(self, tag: str, rank: int, writer: Writer) -> None:
        """Take node ``rank``'s part of ``tag`` for ``writer`` (``parts.claim_part``)."""
        await parts.claim_part(self.objects, self.run, tag, rank, writer)

    async def part_claim(self, tag: str, rank: int) -> Writer | None:
        """Who holds node ``rank``'s part of ``tag``, None when nobody."""
        return await parts.part_claim(self.objects, tag, rank)

    async def upload_part(self, tag: str, root: Path, files: Sequence[LocalFile],
                          session: UploadSession) -> None:
        """Like ``upload``, never over another host's file (``parts.upload_part``)."""
        await parts.upload_part(self.objects, tag, root, files, session)

    async def commit_part(self, part: Part) -> None:
        """Write ``part``'s manifest beside its files, once they are all stored."""
        await parts.commit_part(self.objects, part)

    async def part_ranks(self, tag: str) -> set[int]:
        """The node ranks whose part manifest of ``tag`` is stored (one listing)."""
        return await parts.part_ranks(self.objects, tag)

    async def parts(self, tag: str) -> list[Part]:
        """Every part manifest stored for ``tag``."""
        return await parts.parts(self.objects, self.run, tag, self._concurrency)

    async def uncommitted(self) -> dict[str, list[Part]]:
        """Every tag holding part manifests and no manifest, with its parts."""
        return await parts.uncommitted(self.objects, self.run, self._concurrency)

    async def request_start(self, rank: int, nonce: str) -> None:
        """Store node ``rank``'s start request ``nonce``, replacing its last one."""
        await resume.request_start(self.objects, rank, nonce)

    async def withdraw_start(self, rank: int, nonce: str) -> None:
        """Remove node ``rank``'s start request while it is still ``nonce``."""
        await resume.withdraw_start(self.objects, rank, nonce)

    async def start_requests(self) -> dict[int, str]:
        """Every node's start request, rank → nonce, from one listing."""
        return await resume.start_requests(self.objects)

    async def write_board(self, data: bytes) -> None:
        """Replace the resume board (node 0 alone writes it)."""
        await resume.write_board(self.objects, data)

    async def read_board(self) -> bytes | None:
        """The resume board, None before node 0 wrote one."""
        return await resume.read_board(self.objects)


def open_storage(config: AnyStorage, run: str) -> CheckpointStore:
    """The checkpoint store of ``config`` for run ``run``; no I/O until it is used. On the
    Hub, the repo's root is also read for the checkpoints HF Trainer pushed itself."""
    root = None
    if config.type == "hf":
        root = open_objects(config.model_copy(update={"path_in_repo": ""}), "")
    return CheckpointStore(open_objects(config, run), run, config.concurrency, root)

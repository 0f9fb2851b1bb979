"""An in-memory backend for tests: the same contract as the real ones, no I/O."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Collection, Sequence
from pathlib import Path

from traind.errors import IntegrityError
from traind.layout.keys import check_relpath, check_tag
from traind.layout.manifest import Manifest, Writer
from traind.storage.base import Advance, LocalFile, UploadSession
from traind.storage.claim import Lease, check_committed, check_held, check_lease


class MemoryBackend:
    """Keeps objects in a dict keyed ``<tag>/<path>``; manifests and claims separately."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.manifest_by_tag: dict[str, Manifest] = {}
        self.claims: dict[str, Lease] = {}
        self.takeovers: set[str] = set()
        """The markers of claims taken over (``Lease.marker``)."""

    @property
    def describe(self) -> str:
        return "memory:"

    async def upload(
        self, tag: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        for f in files:
            data = (root / f.path).read_bytes()
            self.objects[f"{check_tag(tag)}/{check_relpath(f.path)}"] = data
            session.advance(len(data))
            await session.file_done(f.path, hashlib.sha256(data).hexdigest())
            await asyncio.sleep(0)

    async def claim(self, tag: str, writer: Writer) -> None:
        if (held := self.claims.get(check_tag(tag))) is not None:
            check_lease(tag, writer, held, self.manifest_by_tag.get(tag), self.describe)
            return
        check_committed(tag, writer, self.manifest_by_tag.get(tag), self.describe)
        self.claims[tag] = Lease.new(writer)

    async def renew(self, tag: str, writer: Writer) -> None:
        held = check_held(tag, writer, self.claims.get(check_tag(tag)), self.describe)
        self.claims[tag] = held.renewed()

    async def release(self, tag: str, writer: Writer) -> None:
        if (held := self.claims.get(check_tag(tag))) is not None and held.writer.id == writer.id:
            self.claims[tag] = held.renewed(0.0)

    async def take_over(self, tag: str, stale: Lease, writer: Writer) -> bool:
        if stale.marker in self.takeovers or self.claims.get(check_tag(tag)) != stale:
            return False
        self.takeovers.add(stale.marker)
        for key in [k for k in self.objects if k.startswith(f"{tag}/")]:
            del self.objects[key]
        del self.claims[tag]
        return True

    async def commit(self, manifest: Manifest) -> None:
        found = self.manifest_by_tag.get(manifest.tag)
        check_committed(manifest.tag, manifest.writer, found, self.describe)
        self.manifest_by_tag[manifest.tag] = manifest

    async def manifests(self) -> list[Manifest]:
        return list(self.manifest_by_tag.values())

    async def download(self, manifest: Manifest, dest: Path, advance: Advance) -> dict[str, str]:
        hashes = {}
        for entry in manifest.files:
            key = f"{manifest.tag}/{entry.path}"
            if key not in self.objects:
                raise IntegrityError(f"memory:{key}: missing from the store")
            data = self.objects[key]
            target = dest / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            advance(len(data))
            hashes[entry.path] = hashlib.sha256(data).hexdigest()
        return hashes

    async def delete(self, tag: str) -> None:
        self.manifest_by_tag.pop(tag, None)
        for key in [k for k in self.objects if k.startswith(f"{tag}/")]:
            del self.objects[key]
        self.claims.pop(tag, None)

    async def probe(self) -> str:
        return "a dict (one event loop: atomic)"

    async def cleanup(self, resume_states: Collection[str]) -> int:
        # Partial files are rewritten by the next upload of their checkpoint.
        return 0

    async def aclose(self) -> None:
        return None

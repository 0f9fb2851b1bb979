"""The in-memory store for tests: every primitive of the interface, no I/O.

Shipped with the code (like structlog's ``capture_logs``) so the whole protocol — claims,
take-over, commits, parts, the resume agreement — runs against it in milliseconds. Its
puts are atomic (one event loop), so it has every capability.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from traind.errors import IntegrityError, MissingFilesError, StorageError
from traind.layout.keys import check_relpath
from traind.storage.base import (
    CREATE,
    OVERWRITE,
    Advance,
    Blob,
    Capabilities,
    LocalFile,
    ObjectMeta,
    PutMode,
    UploadSession,
)

CAPABILITIES = Capabilities(create=True, update=True,
                            claim="a dict on one event loop: a tag is one writer's")
IGNORING = Capabilities(create=False, update=False,
                        claim="claims listed after writing (no atomic create-only put)")
STAGING = Capabilities(create=True, update=True, atomic_delete=True, staged=True,
                       claim="files staged, then published with the manifest in one change")


def version_of(data: bytes) -> str:
    """The version of an object on a store without one of its own: its content's hash."""
    return hashlib.sha256(data).hexdigest()[:32]


class MemoryStore:
    """Objects in a dict keyed like a real store's (``<tag>/<path>``). With ``conditional``
    False its create-only and replace-if-version puts check, then write, with a turn of the
    event loop between (as a client must on a store ignoring ``If-None-Match``/``If-Match``),
    so racing writers can both pass and the protocol's listing fallback decides. With
    ``staged`` it behaves as the Hub does: ``send`` stages files in this handle, ``publish``
    makes them visible with the manifest at once."""

    def __init__(self, conditional: bool = True, staged: bool = False) -> None:
        self.objects: dict[str, bytes] = {}
        self.written: dict[str, float] = {}
        self.staging: dict[str, bytes] = {}
        """What this handle sent and has not published yet (``staged`` only)."""
        self._conditional = conditional
        self._staged = staged

    def handle(self) -> MemoryStore:
        """Another host's handle on the same objects, with staged files of its own."""
        other = MemoryStore(self._conditional, self._staged)
        other.objects, other.written = self.objects, self.written
        return other

    @property
    def describe(self) -> str:
        return "memory:"

    def where(self, key: str) -> str:
        return f"memory:{key}"

    async def capabilities(self) -> Capabilities:
        if self._staged:
            return STAGING
        return CAPABILITIES if self._conditional else IGNORING

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> bool:
        await self._turn()
        if not self._allows(key, mode):
            return False
        if not self._conditional and mode.kind != "overwrite":
            await asyncio.sleep(0)  # checked, then written: another writer may come between
        self._store(key, bytes(data))
        return True

    def _allows(self, key: str, mode: PutMode) -> bool:
        found = self.objects.get(key)
        if mode.kind == "create":
            return found is None
        return mode.kind == "overwrite" or (found is not None and
                                            version_of(found) == mode.version)

    async def publish(self, prefix: str, files: Sequence[LocalFile], note: str, *,
                      key: str | None = None, data: bytes = b"", mode: PutMode = CREATE,
                      unless: str | None = None) -> bool:
        await self._turn()
        keys = [prefix + f.path for f in files]
        found = {k: self.staging.get(k, self.objects.get(k)) for k in keys}
        if missing := [f.path for f, k in zip(files, keys, strict=True)
                       if (d := found[k]) is None or len(d) != f.size]:
            raise MissingFilesError(prefix.rstrip("/"), missing, self.where(prefix))
        if (key is not None and not self._allows(key, mode)) or (
                unless is not None and any(k.startswith(unless) for k in self.objects)):
            return False
        for k in keys:  # all at once, with no turn of the loop between
            if k in self.staging:
                self._store(k, self.staging.pop(k))
        if key is not None:
            self._store(key, bytes(data))
        return True

    async def _turn(self) -> None:
        """Without atomic puts, every request yields to the event loop as a network round
        trip would, so racing writers interleave."""
        if not self._conditional:
            await asyncio.sleep(0)

    def _store(self, key: str, data: bytes) -> None:
        self.objects[key] = data
        self.written[key] = time.time()

    async def get(self, key: str) -> Blob | None:
        await self._turn()
        found = self.objects.get(key)
        return None if found is None else Blob(found, version_of(found))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if (found := self.objects.get(key)) is None:
            raise StorageError(f"memory:{key}: no such object", code="NoSuchKey", key=key)
        return found[start:end]

    async def head(self, key: str) -> ObjectMeta | None:
        found = self.objects.get(key)
        return None if found is None else ObjectMeta(key, len(found), self.written.get(key))

    async def list(self, prefix: str) -> list[ObjectMeta]:
        await self._turn()
        return [ObjectMeta(k, len(v), self.written.get(k))
                for k, v in list(self.objects.items()) if k.startswith(prefix)]

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return sorted({rest.split("/", 1)[0] for k in self.objects if k.startswith(prefix)
                       and "/" in (rest := k[len(prefix):])})

    async def delete(self, keys: Sequence[str]) -> None:
        await self._turn()
        for key in keys:
            self.objects.pop(key, None)
            self.written.pop(key, None)

    async def send(
        self, prefix: str, root: Path, files: Sequence[LocalFile], session: UploadSession
    ) -> None:
        for f in files:
            data = (root / f.path).read_bytes()
            if self._staged:
                self.staging[prefix + check_relpath(f.path)] = data
            else:
                self._store(prefix + check_relpath(f.path), data)
            session.advance(len(data))
            await session.file_done(f.path, hashlib.sha256(data).hexdigest())
            await asyncio.sleep(0)

    async def fetch(
        self, prefix: str, files: Sequence[LocalFile], dest: Path, advance: Advance
    ) -> dict[str, str]:
        hashes = {}
        for f in files:
            if (data := self.objects.get(prefix + f.path)) is None:
                raise IntegrityError(f"memory:{prefix}{f.path}: missing from the store")
            target = dest / check_relpath(f.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            advance(len(data))
            hashes[f.path] = hashlib.sha256(data).hexdigest()
        return hashes

    async def abort_uploads(self, prefix: str, keep: Collection[str] = ()) -> int:
        return 0

    async def probe(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

"""The in-memory checkpoint store for tests: the whole protocol over ``MemoryStore``."""

from __future__ import annotations

from traind.layout.keys import MANIFEST_NAME
from traind.layout.manifest import Manifest
from traind.protocol.store import CheckpointStore
from traind.storage.memory import MemoryStore


class MemoryBackend(CheckpointStore):
    """A ``CheckpointStore`` in a dict: ``memory.objects`` holds every object by key."""

    def __init__(self, run: str) -> None:
        self.memory = MemoryStore()
        super().__init__(self.memory, run)

    @property
    def manifest_by_tag(self) -> dict[str, Manifest]:
        """The committed manifests, by tag (read from the objects)."""
        return {key.split("/", 1)[0]: Manifest.from_json(data)
                for key, data in self.memory.objects.items()
                if key.count("/") == 1 and key.endswith(f"/{MANIFEST_NAME}")}

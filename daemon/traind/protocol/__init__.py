"""The store protocol, written once over the store interface (``traind.storage``): claims and
leases (``claims``, ``lease``, ``listed`` for stores without atomic creates), the checked
commit (``commit``), multi-node parts (``parts``) and the resume agreement (``resume``);
``store.CheckpointStore`` binds them to one store for callers."""

from traind.protocol.store import CheckpointStore, open_storage

__all__ = ["CheckpointStore", "open_storage"]

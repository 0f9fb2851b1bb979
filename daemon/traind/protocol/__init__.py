"""The store protocol, written once over the store interface (``traind.storage``): claims and
leases (``claims``; whose a tag is, ``ownership``; ``listing_claims`` for stores without atomic
creates), the checked commit (``commit``), multi-node parts (``parts``), the resume agreement
(``resume``) and checkpoints HF Trainer pushed itself (``trainer_pushed``);
``store.CheckpointStore`` binds them to one store for callers."""

from traind.protocol.store import CheckpointStore, open_storage

__all__ = ["CheckpointStore", "open_storage"]

"""Build the configured backend, importing its module (and its libraries) only when used."""

from __future__ import annotations

import importlib

from traind.config import LocalStorage, S3Storage, SSHStorage
from traind.storage.base import Storage

_BACKENDS = {
    "local": ("traind.storage.local", "LocalBackend"),
    "s3": ("traind.storage.s3.backend", "S3Backend"),
    "ssh": ("traind.storage.ssh.backend", "SSHBackend"),
}


def open_storage(config: LocalStorage | S3Storage | SSHStorage, run: str) -> Storage:
    """Return the backend for ``config``; no I/O happens until it is used."""
    module, name = _BACKENDS[config.type]
    cls = getattr(importlib.import_module(module), name)
    backend: Storage = cls(config, run)
    return backend

"""Build the configured store, importing its module (and its libraries) only when used."""

from __future__ import annotations

from traind.config import AnyStorage, S3Storage
from traind.storage.base import ObjectStore
from traind.util.runtime import load

STORES = {
    "local": "traind.storage.local:LocalStore",
    "s3": "traind.storage.s3.store:S3Store",
    "s3-obstore": "traind.storage.s3.obstore_store:ObstoreS3Store",
    "ssh": "traind.storage.ssh.store:SSHStore",
    "hf": "traind.storage.hf.store:HFStore",
}


def open_objects(config: AnyStorage, run: str) -> ObjectStore:
    """Return the store of ``config`` holding run ``run``; no I/O happens until it is used."""
    obstore = isinstance(config, S3Storage) and config.client == "obstore"
    store: ObjectStore = load(STORES, "s3-obstore" if obstore else config.type)(config, run)
    return store

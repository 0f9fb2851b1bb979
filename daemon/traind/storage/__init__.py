"""Storage backends behind one small Protocol: what callers use is exported here.

``base.py`` holds the Protocol, ``factory.py`` builds the configured backend (importing its
libraries only then); ``local.py``, ``s3/`` and ``ssh/`` are the backends, ``memory.py`` the
in-memory double for tests.
"""

from traind.storage.base import Advance, LocalFile, PartStore, Storage, UploadSession
from traind.storage.factory import open_storage

__all__ = ["Advance", "LocalFile", "PartStore", "Storage", "UploadSession", "open_storage"]

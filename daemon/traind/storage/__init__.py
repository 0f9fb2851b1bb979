"""The store interface and its stores: what callers use is exported here.

``base.py`` holds the interface (a few primitives), ``factory.py`` builds the configured
store (importing its libraries only then); ``local.py``, ``s3/`` and ``ssh/`` are the stores,
``memory.py`` the in-memory one for tests. The checkpoint protocol above them is
``traind.protocol``.
"""

from traind.storage.base import Advance, LocalFile, ObjectStore, UploadSession
from traind.storage.factory import open_objects

__all__ = ["Advance", "LocalFile", "ObjectStore", "UploadSession", "open_objects"]

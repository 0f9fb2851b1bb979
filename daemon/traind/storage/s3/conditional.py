"""Whether the S3 store honours conditional writes (``If-None-Match``/``If-Match``).

AWS S3 (since 2024), SeaweedFS, MinIO and R2 refuse a create-only put of a key that exists;
some S3-compatible stores ignore the header and overwrite. This is found once per store by
putting one probe object twice with ``If-None-Match: *`` (``TRAIND_S3_CONDITIONAL=0`` says
so without asking); where it is not honoured, the protocol claims tags by listing instead.
Either client's store asks the same way, through its own create-only put.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable

import structlog

from traind.errors import StorageError

log = structlog.get_logger("traind.s3")
CONDITIONAL = "conditional writes (If-None-Match: *): a tag is one writer's"
LISTED = ("claims listed after writing (the store ignores If-None-Match): a tag is one "
          "writer's on a store with read-after-write consistency")
PRECONDITION = frozenset({"PreconditionFailed", "412"})
"""The codes of a conditional put refused because its condition did not hold."""
_OFF = {"0", "false", "no", "off"}
_UNSUPPORTED = {"NotImplemented", "501", "InvalidArgument", "InvalidRequest"}


async def honours_conditional(
    create: Callable[[str, bytes], Awaitable[bool]],
    remove: Callable[[str], Awaitable[None]],
    prefix: str,
) -> bool:
    """Whether the store refuses a second create-only put of one key under ``prefix``
    (``create``: the client's ``If-None-Match: *`` put of a full key, False when refused;
    ``remove`` deletes the probe object again)."""
    if os.environ.get("TRAIND_S3_CONDITIONAL", "").strip().lower() in _OFF:
        return False
    key = f"{prefix}.traind-probe-claim-{uuid.uuid4().hex}"
    try:
        first = await create(key, b"1")
        second = await create(key, b"2")
    except StorageError as exc:  # a store that refuses the header outright
        if exc.code not in _UNSUPPORTED:
            raise
        first = second = True
    finally:
        await remove(key)
    honoured = first and not second
    if not honoured:
        log.warning("s3_conditional_writes_ignored", prefix=prefix, claim=LISTED)
    return honoured

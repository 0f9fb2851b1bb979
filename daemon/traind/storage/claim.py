"""The one decision every backend's ``claim`` and ``commit`` make: whose tag is it?

Pure: a backend reads what the store holds (a claim, a manifest) and asks here whether
this writer may go on; ``ConflictError`` carries both writers for the log and the CLI.
"""

from __future__ import annotations

from traind.checkpoints.manifest import Manifest, Writer
from traind.errors import ConflictError


def check_claim(tag: str, ours: Writer, holder: Writer, where: str) -> None:
    """Raise ConflictError unless the claim on ``tag`` is ``ours`` (a restart, a retry)."""
    if holder.id != ours.id:
        raise ConflictError(tag, str(ours), str(holder), where)


def check_committed(tag: str, ours: Writer | None, found: Manifest | None, where: str) -> None:
    """Raise ConflictError when ``tag`` is committed already by another writer (a manifest
    without a writer, from an older traind, is another's unless this one has none either)."""
    if found is None:
        return
    theirs = found.writer
    if (theirs.id if theirs else None) != (ours.id if ours else None):
        conflict = ConflictError(tag, str(ours), str(theirs or f"an older traind on {found.host}"),
                                 where)
        conflict.committed = found
        raise conflict

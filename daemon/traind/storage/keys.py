"""Validation of the names that become storage keys: tags and relative paths.

Every component is ``[A-Za-z0-9._-]+``, never ``.`` or ``..``; relative paths use ``/`` and
are never absolute. Validating here, once, lets every backend build keys and remote paths
by plain joining without any chance of escaping its prefix or injecting shell syntax.
"""

from __future__ import annotations

import re

from traind.errors import UnsafePathError

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
MANIFEST_NAME = "traind-manifest.json"
CLAIM_NAME = "traind-writer.json"
"""Beside the manifest: which writer took the tag (``Storage.claim``)."""


def check_component(value: str, what: str = "name") -> str:
    """Return ``value`` if it is one safe path component, else raise UnsafePathError."""
    if not _COMPONENT.fullmatch(value) or value in {".", ".."}:
        raise UnsafePathError(
            f"unsafe {what} {value!r}: allowed are letters, digits, '.', '_', '-' "
            "(and not '.' or '..')"
        )
    return value


def check_tag(tag: str) -> str:
    """Return ``tag`` if it is a safe checkpoint tag (one component)."""
    return check_component(tag, "tag")


def check_relpath(rel: str) -> str:
    """Return ``rel`` if it is a safe relative file path inside a checkpoint."""
    if not rel or rel.startswith("/"):
        raise UnsafePathError(f"unsafe relative path {rel!r}: must be relative and non-empty")
    parts = rel.split("/")
    for part in parts:
        check_component(part, "file name" if len(parts) == 1 else f"path component of {rel!r}:")
    if rel in {MANIFEST_NAME, CLAIM_NAME}:
        raise UnsafePathError(f"a checkpoint may not contain a file named {rel}")
    return rel

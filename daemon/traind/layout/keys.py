"""Validation of the names that become storage keys: tags and relative paths.

A tag (and a run name) is one ``[A-Za-z0-9._-]+`` component, never ``.`` or ``..``. A file's
relative path inside a checkpoint may hold spaces and any printable Unicode (trainers write
such names, and every store keeps them as UTF-8), but never a NUL or control character, an
empty, ``.`` or ``..`` component, or a leading ``/``. Validating here, once, lets every backend
build keys and remote paths by plain joining without any chance of escaping its prefix;
no backend hands a path to a shell.
"""

from __future__ import annotations

import re

from traind.errors import UnsafePathError

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
NAME_MAX = 255
"""The longest name of one path component, in UTF-8 bytes: what Linux filesystems hold (a
file named longer could never be restored)."""
PATH_MAX = 4095
"""The longest relative path of a file in a checkpoint, in UTF-8 bytes."""
MANIFEST_NAME = "traind-manifest.json"
CLAIM_NAME = "traind-writer.json"
"""Beside the manifest: which writer took the tag (``Storage.claim``)."""
AGREEMENT_DIR = ".traind-resume"
"""The reserved name beside the run's tags holding the requests and the board: a leading
dot and no step number, so it never matches a checkpoint pattern or passes for a tag."""
PART_PREFIX = "traind-part-"
"""A multi-node checkpoint's part manifests: ``traind-part-<rank>.json`` (layout/parts.py)."""
PART_CLAIM_PREFIX = "traind-writer-"
"""The claims on a multi-node checkpoint's parts: ``traind-writer-<rank>.json``."""


def check_component(value: str, what: str = "name") -> str:
    """Return ``value`` if it is one safe path component, else raise UnsafePathError."""
    if not _COMPONENT.fullmatch(value) or value in {".", ".."} or len(value) > NAME_MAX:
        raise UnsafePathError(
            f"unsafe {what} {value[:80]!r}: allowed are up to {NAME_MAX} letters, digits, "
            "'.', '_', '-' (and not '.' or '..')"
        )
    return value


def check_tag(tag: str) -> str:
    """Return ``tag`` if it is a safe checkpoint tag (one component)."""
    return check_component(tag, "tag")


def check_relpath(rel: str) -> str:
    """Return ``rel`` if it is a safe relative file path inside a checkpoint: ``/``-separated
    components of printable characters (spaces and non-ASCII letters included)."""
    if not rel or rel.startswith("/"):
        raise UnsafePathError(f"unsafe relative path {rel!r}: must be relative and non-empty")
    if len(rel.encode(errors="surrogatepass")) > PATH_MAX or any(
            len(part.encode(errors="surrogatepass")) > NAME_MAX for part in rel.split("/")):
        raise UnsafePathError(f"unsafe relative path {rel[:80]!r}…: longer than {PATH_MAX} "
                              f"bytes, or a name longer than {NAME_MAX}")
    for part in rel.split("/"):
        if part in {"", ".", ".."}:
            raise UnsafePathError(
                f"unsafe relative path {rel!r}: empty, '.' and '..' components are not allowed"
            )
        if not part.isprintable():
            raise UnsafePathError(
                f"unsafe relative path {rel!r}: control characters (and bytes that are not "
                "UTF-8) are not allowed in file names"
            )
    if reserved(rel):
        raise UnsafePathError(f"a checkpoint may not contain a file named {rel}: traind "
                              "keeps its manifest, claims and part manifests under that name")
    return rel


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe store key under a run's root: like ``check_relpath``
    but traind's own names allowed (the stores' last guard: a key never leaves the root)."""
    if not key or key.startswith("/"):
        raise UnsafePathError(f"unsafe store key {key!r}: must be relative and non-empty")
    for part in key.split("/"):
        if part in {"", ".", ".."} or not part.isprintable():
            raise UnsafePathError(f"unsafe store key {key!r}: empty, '.', '..' or control "
                                  "characters in a component")
    return key


def reserved(rel: str) -> bool:
    """Whether ``rel`` is a name traind stores beside a checkpoint's files (its manifest,
    a claim, a part manifest), so no checkpoint file may have it."""
    if rel in {MANIFEST_NAME, CLAIM_NAME}:
        return True
    return rel.endswith(".json") and rel.startswith((PART_PREFIX, PART_CLAIM_PREFIX))

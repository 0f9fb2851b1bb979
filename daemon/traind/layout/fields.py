"""What a JSON object read back from the store may hold: one parse with bounds on size and
nesting, and a check per field (type, finiteness, range).

Everything traind keeps in the store as JSON — manifests, part manifests, claims, the resume
board — is read through ``parse``, its fields through the checks here, so a lie or damage
in the store is refused in one place with one clear message (``IntegrityError``, raised by
the callers) rather than crashing whatever command read it.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from traind.errors import IntegrityError

INT_LIMIT = 2**63
"""Every step, size, total and count in the store is below this: the journal keeps them as
SQLite INTEGERs, and no store holds an object that large."""
MAX_OBJECT_BYTES = 64 * 1024 * 1024
"""The largest JSON object parsed: a manifest of a 100 000-file checkpoint weighs about
25 MB (each file's path, size and sha256 on five indented lines), so this leaves room for
long paths or several times the files, and bounds what one object can make a command hold."""
T = TypeVar("T")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 60


def parse(data: bytes | str, what: str) -> dict[str, Any]:
    """``data`` as the JSON object it must be (strict JSON: no NaN or Infinity); raise
    IntegrityError naming ``what`` when it is too large, too deeply nested or not one."""
    if len(data) > MAX_OBJECT_BYTES:
        raise IntegrityError(f"malformed {what}: {len(data)} bytes, more than the "
                             f"{MAX_OBJECT_BYTES} traind reads")
    try:
        raw = json.loads(data, parse_constant=_constant)
    except RecursionError as exc:
        raise IntegrityError(f"malformed {what}: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, _constant's
        raise IntegrityError(f"malformed {what}: {exc}") from exc
    if not isinstance(raw, dict):
        raise IntegrityError(f"malformed {what}: not a JSON object")
    return raw


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read(data: bytes | str, what: str, build: Callable[[dict[str, Any]], T]) -> T:
    """``build`` applied to ``data`` parsed (``parse``); IntegrityError "malformed <what>:
    <problem>" when either refuses it (``build`` raises ValueError, KeyError or TypeError)."""
    raw = parse(data, what)
    try:
        return build(raw)
    except KeyError as exc:
        raise IntegrityError(f"malformed {what}: no {exc.args[0]!r}") from exc
    except (ValueError, TypeError) as exc:
        raise IntegrityError(f"malformed {what}: {exc}") from exc


def obj(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """The JSON object at ``key``; ValueError (KeyError when absent) otherwise."""
    value = raw[key]
    if not isinstance(value, dict):
        raise ValueError(f"{key} {shown(value)} is not an object")
    return value


def text(raw: Mapping[str, Any], key: str) -> str:
    """The string at ``key``."""
    value = raw[key]
    if not isinstance(value, str):
        raise ValueError(f"{key} {shown(value)} is not a string")
    return value


def count(raw: Mapping[str, Any], key: str, limit: int = INT_LIMIT) -> int:
    """The integer at ``key``, in 0..limit-1 (a JSON ``true`` is not one)."""
    value = raw[key]
    if type(value) is not int or not 0 <= value < limit:
        raise ValueError(f"{key} {shown(value)} is not an integer in 0..{limit - 1}")
    return value


def real(raw: Mapping[str, Any], key: str) -> float:
    """The finite number at ``key``, as a float."""
    value = raw[key]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"{key} {shown(value)} is not a finite number")
    return float(value)


def sha256(raw: Mapping[str, Any], key: str) -> str:
    """The sha256 at ``key``: exactly 64 lowercase hex digits."""
    value = text(raw, key)
    if not _SHA256.fullmatch(value):
        raise ValueError(f"{key} {shown(value)} is not 64 lowercase hex digits")
    return value


def optional(raw: Mapping[str, Any], key: str,
             field: Callable[[Mapping[str, Any], str], T]) -> T | None:
    """``field(raw, key)``, or None when ``key`` is absent or null."""
    return None if raw.get(key) is None else field(raw, key)


def decimal(name: str) -> int | None:
    """The integer ``name`` writes in ASCII decimal digits (a rank in an object's name),
    below INT_LIMIT; None when it is not one."""
    if name.isascii() and name.isdigit() and len(name) < 20 and int(name) < INT_LIMIT:
        return int(name)
    return None


def shown(value: object) -> str:
    """``value`` as an error may quote it: a short repr, however large it is."""
    return _shown.repr(value)

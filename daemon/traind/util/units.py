"""Durations and sizes written the human way: ``"30s"``, ``"10m"``, ``"64MiB"``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

_DURATION = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*", re.IGNORECASE)


def parse_duration(value: object) -> float:
    """Seconds from ``"90s"``, ``"10m"``, ``"1.5h"``, ``"250ms"`` or a bare number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # a TOML integer too large for a float
            seconds = math.inf
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m[1]) * _DURATION_UNITS[(m[2] or "s").lower()]
    else:
        raise ValueError(
            f"{value!r} is not a duration; write a number with a unit: ms, s, m, h, d "
            "(e.g. '30s', '10m')"
        )
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r}: a duration must be a finite number of seconds")
    if seconds < 0:
        raise ValueError(f"{value!r}: a duration cannot be negative")
    return seconds


def parse_positive_duration(value: object) -> float:
    """Like ``parse_duration``, but 0 is refused: for intervals and timeouts, where 0 would
    mean a busy loop or an instant failure rather than anything useful."""
    seconds = parse_duration(value)
    if seconds == 0:
        raise ValueError(f"{value!r}: must be longer than 0 (e.g. '1s')")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``"64MiB"``, ``"1GB"``, ``"512k"`` or a bare number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        unit = (m[2] or "").lower()
        base = 1024 if "i" in unit else 1000
        power = "bkmgt".find(unit[0]) if unit else 0
        scaled = float(m[1]) * (base**power if power > 0 else 1)
        if not math.isfinite(scaled):  # hundreds of digits: no int() of infinity
            raise ValueError(f"{value!r}: a size must be a finite number of bytes")
        size = int(scaled)
    else:
        raise ValueError(
            f"{value!r} is not a size; write a number with a unit: B, KiB, MiB, GiB, KB, MB, GB "
            "(e.g. '64MiB')"
        )
    if size < 0:
        raise ValueError(f"{value!r}: a size cannot be negative")
    return size


def parse_floor(value: object) -> tuple[float, int]:
    """A free-space floor: ``"1.5x"`` → (1.5, 0), times a checkpoint's size; a size such as
    ``"20GiB"`` → (0.0, bytes); ``0`` → (0.0, 0), no floor."""
    if isinstance(value, str) and value.strip().lower().endswith("x"):
        number = value.strip()[:-1].strip()
        try:
            factor = float(number)
        except ValueError:
            factor = math.nan
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"{value!r}: write a multiple of the checkpoint size such as "
                             "'1.5x', or a size such as '20GiB'")
        return factor, 0
    return 0.0, parse_size(value)


def format_size(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _Parsed:
    """``Annotated`` metadata for pydantic: ``parse`` runs on the raw value before the field's
    own validation, as pydantic's ``BeforeValidator`` does, but through pydantic's public
    ``__get_pydantic_core_schema__`` hook, so that importing this module (``traind status``
    formats sizes) does not import pydantic."""

    parse: Callable[[object], object]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(self.parse, handler(source))


Duration = Annotated[float, _Parsed(parse_duration)]
PositiveDuration = Annotated[float, _Parsed(parse_positive_duration)]
Size = Annotated[int, _Parsed(parse_size)]


def _floor(value: object) -> object:
    """Check a floor (see ``parse_floor``), keeping it as written."""
    parse_floor(value)
    return value


Floor = Annotated[str | int, _Parsed(_floor)]

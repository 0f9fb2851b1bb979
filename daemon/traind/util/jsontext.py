"""JSON that every parser accepts: what ``--json`` prints and ``/status`` serves."""

from __future__ import annotations

import json
import math
from typing import Any


def strict_json(value: Any, indent: int | None = None) -> str:
    """``value`` as strict JSON (RFC 8259, no ``NaN`` or ``Infinity``, which ``jq`` and
    most parsers refuse): a float that is not finite becomes null."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value

"""The Python runtime, used the same way everywhere: a class imported by name only when it
is chosen (a vast user never imports the nebius SDK, a local store never imports
aiobotocore), and long-lived objects left out of the garbage collector's rescans."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Mapping


def load(table: Mapping[str, str], name: str) -> type:
    """The class ``table[name]`` names as ``"module:Class"``, its module imported now."""
    module, _, attr = table[name].partition(":")
    cls: type = getattr(importlib.import_module(module), attr)
    return cls


def long_lived() -> None:
    """Freeze what exists now (a store client's service model, the imported modules):
    process-wide, so it is for a command's top level to call, once its store answered.
    Otherwise every collection rescans those objects as transfers allocate (a share of a
    restore's CPU: see bench/README.md)."""
    gc.freeze()

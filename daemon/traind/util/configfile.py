"""Which config file a command reads: ``-c``, else ``$TRAIND_CONFIG``, else the default.

Apart from ``config`` so that a command which only needs the file's name (``traind status``
finding the daemon, the argument parser) does not import pydantic.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_CONFIG = Path("/etc/traind/traind.toml")


def config_path(explicit: str | Path | None = None) -> Path:
    """The config file to use: the explicit one, else ``$TRAIND_CONFIG``, else the default."""
    return Path(explicit or os.environ.get("TRAIND_CONFIG") or DEFAULT_CONFIG)


def path_arg(value: str) -> str:
    """A ``-c/--config`` value (argparse ``type``): an empty one (``-c "$UNSET"``) must not
    quietly mean the default file."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty path; give the config file's path")
    return value

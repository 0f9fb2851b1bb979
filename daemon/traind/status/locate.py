"""Where ``traind status`` finds the daemon when the config file cannot tell it (a bad edit
before ``systemctl reload``): the address the daemon published in its state_dir, else the
file's ``status.listen`` if it can still be read, else the default."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from traind import config
from traind.errors import ConfigError
from traind.util.address import parse_listen

ADDRESS_FILE = "status.address"
"""In run.state_dir: the address the daemon's status server listens on, one line, written
once it listens and removed when it stops."""


def publish(state_dir: Path, listen: str) -> None:
    """Write ``listen`` to ``state_dir/status.address`` (temporary name, then rename)."""
    tmp = state_dir / f".{ADDRESS_FILE}.tmp"
    tmp.write_text(f"{listen}\n")
    os.replace(tmp, state_dir / ADDRESS_FILE)


def withdraw(state_dir: Path) -> None:
    """Remove ``state_dir/status.address``: nothing listens there any more."""
    with contextlib.suppress(FileNotFoundError):
        (state_dir / ADDRESS_FILE).unlink()


def locate(path: Path) -> tuple[str, str]:
    """The status address to try for the daemon of the (unloadable) config file ``path``,
    and where it came from, for the message when nothing answers there."""
    raw = _raw(path)
    for state_dir in _state_dirs(raw):
        published = state_dir / ADDRESS_FILE
        try:
            listen = published.read_text().strip()
            parse_listen(listen)
        except (OSError, ValueError):
            continue
        return listen, f"published in {published}"
    named = os.environ.get("TRAIND_STATUS__LISTEN") or _key(raw, "status", "listen")
    if named is not None:
        with contextlib.suppress(ValueError):
            parse_listen(named)
            return named, f"status.listen in {path}"
    default = config.StatusConfig().listen
    return default, f"the default status.listen (no {ADDRESS_FILE} found in run.state_dir)"


def _raw(path: Path) -> dict[str, Any]:
    """What can still be read of the file: its TOML, or when that is broken, the lines that
    look like ``state_dir = "..."`` and ``listen = "..."``."""
    try:
        return config.read_toml(path)
    except ConfigError:
        pass
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    found: dict[str, Any] = {}
    for section, key in (("run", "state_dir"), ("status", "listen")):
        if match := re.search(rf'^\s*{key}\s*=\s*"([^"]+)"', text, re.MULTILINE):
            found[section] = {key: match.group(1)}
    return found


def _state_dirs(raw: dict[str, Any]) -> list[Path]:
    """The state_dirs the daemon may be using, most specific first."""
    named = [os.environ.get("TRAIND_RUN__STATE_DIR"), _key(raw, "run", "state_dir")]
    default = config.RunConfig.model_fields["state_dir"].default
    return [Path(d) for d in named if d and Path(d).is_absolute()] + [default]


def _key(raw: dict[str, Any], section: str, key: str) -> str | None:
    """``[section] key`` of the raw file when it is a string."""
    value = raw.get(section, {}).get(key) if isinstance(raw.get(section), dict) else None
    return value if isinstance(value, str) else None

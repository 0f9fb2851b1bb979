"""Where ``traind status`` finds the daemon: first at the address the config file names,
read without validating the file (``named``); when nothing answers there and the file does
not validate (a bad edit before ``systemctl reload``), at the address the daemon published in
its state_dir, else the file's ``status.listen`` if it can still be read, else the default
(``locate``)."""

from __future__ import annotations

import contextlib
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from traind.util.address import DEFAULT_LISTEN, parse_listen

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


def named(path: Path) -> str | None:
    """The status address that the config file ``path`` and the environment give, read
    without validating the file, which would import pydantic: ``TRAIND_STATUS__LISTEN``
    (pydantic-settings reads names in any case), else ``[status] listen``, else the default.
    None when it cannot be told that way: the file is not TOML, the value is not an address,
    or the whole section comes from ``TRAIND_STATUS``."""
    env = {name.upper(): value for name, value in os.environ.items()}
    raw = _toml(path)
    if raw is None or "TRAIND_STATUS" in env:
        return None
    section = raw.get("status", {})
    listen = env.get("TRAIND_STATUS__LISTEN",
                     section.get("listen", DEFAULT_LISTEN) if isinstance(section, dict) else None)
    if not isinstance(listen, str):
        return None
    try:
        parse_listen(listen)
    except ValueError:
        return None
    return listen


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
    return DEFAULT_LISTEN, f"the default status.listen (no {ADDRESS_FILE} found in run.state_dir)"


def _toml(path: Path) -> dict[str, Any] | None:
    """The file parsed as TOML, or None when it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_bytes().decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _raw(path: Path) -> dict[str, Any]:
    """What can still be read of the file: its TOML, or when that is broken, the lines that
    look like ``state_dir = "..."`` and ``listen = "..."``."""
    if (raw := _toml(path)) is not None:
        return raw
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
    from traind import config  # validation has failed already: pydantic is imported

    given = [os.environ.get("TRAIND_RUN__STATE_DIR"), _key(raw, "run", "state_dir")]
    default = config.RunConfig.model_fields["state_dir"].default
    return [Path(d) for d in given if d and Path(d).is_absolute()] + [default]


def _key(raw: dict[str, Any], section: str, key: str) -> str | None:
    """``[section] key`` of the raw file when it is a string."""
    value = raw.get(section, {}).get(key) if isinstance(raw.get(section), dict) else None
    return value if isinstance(value, str) else None

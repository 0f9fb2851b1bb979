"""Launches and claims saved on this machine, so ``traind launch down NAME`` works from any shell.

Everything lives under ``$TRAIND_LAUNCH_STATE`` (tests point it at a temporary directory),
else ``$XDG_STATE_HOME/traind/launches``, else ``~/.local/state/traind/launches``:
``<name>.json`` per launch, ``<name>.known_hosts`` for hosts trusted on first use, and
``claims/<host>.json`` for inventory hosts held by a launch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from traind.launch.base import Handle
from traind.launch.errors import LaunchError, LaunchNotFoundError, ProvisionError
from traind.layout.keys import check_component

STATE_ENV = "TRAIND_LAUNCH_STATE"


def default_root() -> Path:
    """The directory launches are saved in (see the module docstring)."""
    if explicit := os.environ.get(STATE_ENV):
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(xdg) / "traind" / "launches"


@dataclass(frozen=True)
class LaunchRecord:
    """One launch: its handle and how traind was set up on the host."""

    name: str
    config_path: str
    handle: Handle
    remote_root: str
    service: str = ""
    python: str = ""
    created_at: float = 0.0
    recoveries: tuple[dict[str, Any], ...] = ()
    stopping: bool = False
    """``down`` is under way: no recovery starts another job or host."""
    """One entry per job/host replaced after it ended early (see ``launch.recovery``)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "handle": self.handle.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchRecord:
        """The inverse of ``to_json``."""
        return cls(**{**data, "handle": Handle.from_json(data["handle"]),
                      "recoveries": tuple(data.get("recoveries", ()))})

    def with_(self, **changes: Any) -> LaunchRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)


class LaunchStore:
    """Saved launch records and host claims, one small JSON file each, written atomically."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()

    def path(self, name: str) -> Path:
        """The record file of launch ``name``."""
        return self.root / f"{check_component(name, 'launch name')}.json"

    def known_hosts(self, name: str) -> Path:
        """The known_hosts file for hosts this launch trusted on first use."""
        return self.root / f"{check_component(name, 'launch name')}.known_hosts"

    def save(self, record: LaunchRecord) -> LaunchRecord:
        """Write ``record`` (replacing an older one of the same name) and return it."""
        _write_json(self.path(record.name), record.to_json())
        return record

    def load(self, name: str) -> LaunchRecord:
        """The record of launch ``name``; raise LaunchNotFoundError when there is none."""
        try:
            data = json.loads(self.path(name).read_text())
        except FileNotFoundError as exc:
            raise LaunchNotFoundError(
                f"no launch named {name!r} in {self.root} (see: traind launch list)"
            ) from exc
        except (OSError, ValueError) as exc:
            raise LaunchError(f"cannot read launch {name!r}: {exc}") from exc
        return LaunchRecord.from_json(data)

    def exists(self, name: str) -> bool:
        """Whether launch ``name`` is saved."""
        return self.path(name).is_file()

    def live(self, name: str) -> bool:
        """Whether launch ``name`` is saved and not being taken down."""
        try:
            return self.exists(name) and not self.load(name).stopping
        except LaunchError:
            return False

    def remove(self, name: str) -> None:
        """Forget launch ``name`` (and its trusted host keys)."""
        for path in (self.path(name), self.known_hosts(name)):
            path.unlink(missing_ok=True)

    def names(self) -> list[str]:
        """Every saved launch, by name."""
        return sorted(p.stem for p in self.root.glob("*.json"))

    def claim(self, host: str, label: str) -> None:
        """Hold inventory host ``host`` for launch ``label``; ProvisionError if already held."""
        path = self.root / "claims" / f"{check_component(host, 'host name')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "x") as f:
                json.dump({"host": host, "label": label, "claimed_at": time.time()}, f)
        except FileExistsError as exc:
            holder = self.claims().get(host, "?")
            raise ProvisionError(f"host {host} is already claimed by launch {holder!r}") from exc

    def release(self, host: str) -> bool:
        """Let go of ``host``; False when it was not held."""
        path = self.root / "claims" / f"{check_component(host, 'host name')}.json"
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def claims(self) -> dict[str, str]:
        """Held hosts → the launch holding each."""
        held = {}
        for path in (self.root / "claims").glob("*.json"):
            try:
                held[path.stem] = str(json.loads(path.read_text()).get("label", "?"))
            except (OSError, ValueError):
                held[path.stem] = "?"
        return held


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)

"""API keys from where each provider's own tools keep them: launch.toml, then an environment
variable, then the provider CLI's file. Keys stay ``SecretStr`` so no repr or log shows them."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import SecretStr

from traind.errors import ConfigError

Reader = Callable[[str], str | None]
"""Turns a credentials file's text into the key it holds, or None."""


def whole_file(text: str) -> str | None:
    """A file holding just the key (vastai's ``vast_api_key``)."""
    return text.strip() or None


def toml_key(text: str) -> str | None:
    """``apikey`` / ``api_key`` at the top of a TOML file or in its ``[default]`` table
    (runpodctl's and the RunPod SDK's ``~/.runpod/config.toml``)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    for table in (data, data.get("default")):
        if isinstance(table, dict):
            for name in ("apikey", "api_key"):
                if isinstance(table.get(name), str) and table[name].strip():
                    return str(table[name]).strip()
    return None


def assignment_key(text: str) -> str | None:
    """An ``api_key = KEY`` line (``~/.lambda_cloud/lambda_keys``, as SkyPilot writes it)."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "api_key" and value.strip():
            return value.strip().strip("'\"")
    return None


def api_key(
    explicit: SecretStr | None, section: str, env: str, files: Sequence[Path],
    read: Reader = whole_file, environ: dict[str, str] | None = None,
) -> SecretStr:
    """The key: ``explicit`` (launch.toml), else ``$env``, else the first of ``files`` that
    holds one; ConfigError naming every place looked in."""
    if explicit is not None:
        return explicit
    if value := (environ if environ is not None else os.environ).get(env, "").strip():
        return SecretStr(value)
    for path in files:
        try:
            found = read(path.expanduser().read_text())
        except OSError:
            continue
        if found:
            return SecretStr(found)
    places = ", ".join(str(p) for p in files)
    raise ConfigError([f"{section}.api_key: missing (set it, export {env}, or put it in {places})"])

"""Dependency gates: skip locally with a reason, fail under CI (``CI=true``)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def missing(reason: str) -> None:
    """Skip the test with ``reason`` locally; fail it under CI, where nothing may skip."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required under CI but missing: {reason}", pytrace=False)
    pytest.skip(reason)


def need_module(name: str) -> None:
    """Skip (or fail under CI) unless the Python module ``name`` can be imported."""
    if importlib.util.find_spec(name) is None:
        missing(f"python module {name!r} is not installed")


def need_binary(name: str) -> str:
    """Return the path of executable ``name``; skip (or fail under CI) when absent."""
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path is None:
        missing(f"executable {name!r} is not on PATH")
        raise AssertionError("unreachable")
    return path

"""Strict JSON for what traind prints and serves."""

from __future__ import annotations

import json

import pytest

from traind.util.jsontext import strict_json


def test_json_output_is_strict() -> None:
    """What --json prints and /status serves parses as strict JSON: a NaN or infinity
    (which JSON has no number for) becomes null, nested anywhere."""
    text = strict_json({"a": [float("nan"), 1.5, {"b": float("-inf")}], "c": (2, "x")})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(name)) == {
        "a": [None, 1.5, {"b": None}], "c": [2, "x"]}

"""Helpers shared by the test suites: real servers, tiny trainers, dependency gates."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: where config/, docs/ and the README are, wherever a test file sits."""

"""Imports by name and the GC freeze, used by stores, launch backends and commands."""

from __future__ import annotations

import gc

import pytest

from traind.storage.factory import STORES
from traind.util.runtime import load, long_lived


def test_load_imports_the_named_class_only_when_asked() -> None:
    """``module:Class`` resolves to the class; an unknown name is a KeyError."""
    from traind.storage.local import LocalStore

    assert load(STORES, "local") is LocalStore
    with pytest.raises(KeyError):
        load(STORES, "ftp")


def test_long_lived_freezes_what_exists_now() -> None:
    """After long_lived the objects that existed are in the permanent generation."""
    gc.unfreeze()  # whatever an earlier test froze: the count below is this call's
    assert gc.get_freeze_count() == 0
    try:
        long_lived()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()

"""Every test here talks to the Hub stand-in through the real huggingface_hub, told to send
bytes over LFS: the stand-in's protocol (it does not serve Xet)."""

from __future__ import annotations

import pytest
from tests.support.requires import need_module


@pytest.fixture(autouse=True)
def lfs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    need_module("huggingface_hub")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_XET", True)

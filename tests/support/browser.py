"""Headless Chromium from the system packages, driven by Playwright for Python.

Playwright's own browser download needs the internet; the system's ``chromium`` is used
instead, with a fresh profile per launch (Playwright makes and removes it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.requires import missing, need_module

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
"""No sandbox: as root Chromium refuses to start with one."""


def chromium_path() -> str:
    """The system Chromium; skip (or fail under CI) without it."""
    need_module("playwright")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        missing("executable 'chromium' is not on PATH (Debian package chromium)")
        raise AssertionError("unreachable")
    return path


@contextmanager
def chromium(timeout: float = 30.0) -> Iterator[Any]:
    """A running headless Chromium (a Playwright ``Browser``), closed on the way out."""
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True,
                                    timeout=timeout * 1000)
        try:
            yield browser
        finally:
            browser.close()

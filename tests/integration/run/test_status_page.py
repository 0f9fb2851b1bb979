"""The status page in a real headless Chromium, against a real daemon running a tiny TRL
training run that streams to SeaweedFS: it follows commits, a killed trainer's restart and a
store outage without a reload, reads on a phone, and is a plain page without JavaScript."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.browser import chromium
from tests.support.daemon import DaemonProcess, is_event, write_config
from tests.support.monitoring import dashboard_queries, exported, names_in
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import SeaweedS3, running_seaweed
from tests.support.tiny_train import QUIET_ENV, train_command

WAIT = 120_000  # ms: the longest any one thing on the page may take to show
SCREENSHOT = "status-page.png"


def artifacts(tmp_path: Path) -> Path:
    """Where the screenshots go: ``$TRAIND_ARTIFACTS`` when set (docs/ takes them from
    there), else the test's own directory."""
    where = Path(os.environ.get("TRAIND_ARTIFACTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


def status(url: str) -> dict[str, Any]:
    """The daemon's /status document, within 5 s."""
    with urllib.request.urlopen(f"{url}/status", timeout=5) as response:
        return dict(json.load(response))


def row_shows(table: str, first: str, column: int, text: str) -> str:
    """A JS predicate: the row of ``#table`` whose first cell is ``first`` has ``text`` in
    cell ``column``."""
    return (f"() => [...document.querySelectorAll('#{table} tbody tr')].some(r => "
            f"r.cells[0].textContent === {json.dumps(first)} && "
            f"r.cells[{column}].textContent.includes({json.dumps(text)}))")


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS with bucket ``ckpts``."""
    need_module("trl")
    need_module("aiobotocore")
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("ckpts")
        yield server


@pytest.fixture
def daemon(tmp_path: Path, seaweed: SeaweedS3) -> Iterator[tuple[DaemonProcess, str]]:
    """traind running a slow tiny training run (a checkpoint every two steps) into
    SeaweedFS; its status URL. Killed on the way out."""
    out = tmp_path / "out"
    out.mkdir()
    argv = train_command(out, max_steps=400, save_steps=2, callback=True, step_sleep=0.5,
                         resume=True)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    trainer = (f"[trainer]\ncommand = {json.dumps(argv)}\nenv = {{ {env} }}\n"
               'restart = { policy = "on-failure", backoff_initial = "0.5s" }\n')
    cfg = write_config(tmp_path / "traind.toml", run="exp", output_dir=out,
                       state_dir=tmp_path / "state", storage=seaweed.storage_toml(),
                       extra=trainer)
    proc = DaemonProcess(cfg)
    try:
        listen = proc.wait_for("status_server_started", timeout=60)["listen"]
        yield proc, f"http://{listen}"
    finally:
        proc.stop(timeout=30)


def test_page_follows_the_run(
    daemon: tuple[DaemonProcess, str], seaweed: SeaweedS3, tmp_path: Path
) -> None:
    """Commits, a killed trainer's restart and a store outage (with its hint) appear on
    the page without a reload; the screenshot is saved."""
    proc, url = daemon
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.set_default_timeout(WAIT)
        loads: list[str] = []
        page.on("load", lambda _: loads.append(page.url))
        page.goto(url + "/")
        assert "committed</span>" not in page.inner_html("#main")  # nothing yet: it updates
        page.evaluate("window.traindMarker = 1")

        for n in (2, 4, 6):
            page.wait_for_function(row_shows("timeline", f"checkpoint-{n}", 5, "committed"))
        proc.wait_for(is_event("checkpoint_committed", step=6), timeout=10)

        trainer = next(c for c in status(url)["children"] if c["name"] == "trainer")
        os.kill(trainer["pid"], signal.SIGKILL)
        page.wait_for_function(row_shows("children", "trainer", 5, "-9"))
        page.wait_for_function(row_shows("children", "trainer", 4, "1"))
        page.wait_for_function(row_shows("children", "trainer", 1, "RUNNING"))

        seaweed.stop()
        try:
            page.wait_for_selector("#errors li:has-text('checkpoint_upload_failed')")
            hint = page.inner_text("#errors li:has-text('checkpoint_upload_failed') .hint")
            assert "retried with backoff" in hint
        finally:
            seaweed.start()
        failed = proc.wait_for("checkpoint_upload_failed", timeout=10)["tag"]
        proc.wait_for(is_event("checkpoint_committed", tag=failed), timeout=120)
        step = int(failed.removeprefix("checkpoint-"))
        page.wait_for_function(  # the newest in the store is at least the one that failed
            "n => Number(document.querySelector('#committed tbody tr').cells[1].textContent)"
            " >= n", arg=step)
        stamp = page.inner_text("#updated")  # and the page is one made after its commit
        page.wait_for_function("s => document.getElementById('updated').textContent !== s",
                               arg=stamp)

        assert page.evaluate("window.traindMarker") == 1  # the same document throughout
        assert loads == [url + "/"]
        page.screenshot(path=str(artifacts(tmp_path) / SCREENSHOT), full_page=True)

        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            names = exported(response.read().decode())
        queried = {n for exprs in dashboard_queries().values() for e in exprs
                   for n in names_in(e)}
        assert queried - names == set()


def test_page_on_a_phone_and_without_javascript(
    daemon: tuple[DaemonProcess, str], tmp_path: Path
) -> None:
    """On a phone's width nothing but the tables' own scroll overflows; without JavaScript
    the same tables are there, served whole."""
    proc, url = daemon
    proc.wait_for(is_event("checkpoint_committed", step=2), timeout=120)
    with chromium() as browser:
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True,
                                 device_scale_factor=2)
        phone.set_default_timeout(WAIT)
        phone.goto(url + "/")
        phone.wait_for_function(row_shows("children", "trainer", 1, "RUNNING"))
        assert phone.evaluate(
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        phone.screenshot(path=str(artifacts(tmp_path) / "status-page-phone.png"),
                         full_page=True)

        plain = browser.new_context(java_script_enabled=False).new_page()
        plain.goto(url + "/")
        assert plain.locator("#children tbody tr").count() == 1
        assert plain.locator("#timeline tbody tr:has-text('checkpoint-2')").count() == 1
        assert plain.locator("noscript").count() == 1

"""Secrets never shown, through the real CLI and a running daemon: a password inside the S3
endpoint URL is masked in every error, log line, ``/status``, ``traind status`` and the status
page; a secret of the wrong type is not echoed by ``traind check-config``."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.daemon import DaemonProcess, write_config
from tests.support.net import free_port
from tests.support.requires import need_module

PASSWORD = "pa55-in-the-url"
KEY = "wJalrXUtnFEMI-the-secret-key"
ENDPOINT = "http://admin:{}@127.0.0.1:{}"


def traind(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, within 60 s."""
    return subprocess.run([sys.executable, "-m", "traind", *args], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config streaming to an S3 endpoint nothing listens on, its URL holding a password."""
    need_module("aiobotocore")
    storage = (f'type = "s3"\nbucket = "ckpts"\n'
               f'endpoint_url = "{ENDPOINT.format(PASSWORD, free_port())}"\n'
               f'access_key_id = "AKIAEXAMPLE"\nsecret_access_key = "{KEY}"\n'
               'retries = 0\nconnect_timeout = "1s"\n')
    return write_config(tmp_path / "traind.toml", run="exp", output_dir=tmp_path / "out",
                        state_dir=tmp_path / "state", storage=storage)


@pytest.fixture
def daemon(config: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """traind waiting for that store; its status URL. Stopped on the way out."""
    proc = DaemonProcess(config)
    try:
        listen = proc.wait_for("status_server_started", timeout=60)["listen"]
        proc.wait_for("store_unreachable", timeout=60)
        yield proc, f"http://{listen}"
    finally:
        proc.stop(timeout=30)


def get(url: str) -> str:
    """The body at ``url``, within 5 s."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_a_password_in_the_endpoint_url_is_shown_nowhere(
    daemon: tuple[DaemonProcess, str], config: Path
) -> None:
    """/status, the page, ``traind status`` and the daemon's log name the endpoint with its
    password masked, and show neither it nor the secret key."""
    proc, url = daemon
    status = json.loads(get(f"{url}/status"))
    assert status["state"] == "waiting_for_store"
    assert "http://admin:***@127.0.0.1:" in status["backend"]
    assert any("http://admin:***@127.0.0.1:" in e["message"] for e in status["errors"])
    page = get(f"{url}/")
    assert "http://admin:***@127.0.0.1:" in page
    shown = traind("status", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "http://admin:***@127.0.0.1:" in shown.stdout
    as_json = traind("status", "--json", "-c", str(config))
    proc.stop(timeout=30)
    logged = "".join(proc.raw)
    assert "http://admin:***@127.0.0.1:" in logged
    for seen in (json.dumps(status), page, shown.stdout + shown.stderr,
                 as_json.stdout + as_json.stderr, logged):
        assert PASSWORD not in seen
        assert KEY not in seen


def test_commands_never_show_the_password_in_their_errors(config: Path) -> None:
    """``check-config`` and ``list`` fail on the endpoint (aiohttp refuses credentials in
    the URL of a signed request) naming it masked."""
    for args in (["check-config", "--timeout", "20"], ["list"]):
        done = traind(*args, "-c", str(config))
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert "at http://admin:***@127.0.0.1:" in done.stderr
        assert PASSWORD not in done.stdout + done.stderr


def test_check_config_never_echoes_a_secret_of_the_wrong_type(tmp_path: Path) -> None:
    """A secret key given as a list, an HF token as a number: named, their values not shown."""
    for storage, key in [
        (f'type = "s3"\nbucket = "b"\naccess_key_id = "AKIAEXAMPLE"\n'
         f'secret_access_key = ["{KEY}"]\n', "storage.secret_access_key"),
        ('type = "hf"\nrepo_id = "org/ckpts"\ntoken = 8675309123\n', "storage.token"),
    ]:
        cfg = write_config(tmp_path / "bad.toml", run="exp", output_dir=tmp_path / "out",
                           state_dir=tmp_path / "state", storage=storage)
        done = traind("check-config", "--offline", "-c", str(cfg))
        assert done.returncode == 2, done.stderr
        assert f"{key} = *** (a secret: its value is not shown)" in done.stderr
        assert KEY not in done.stderr
        assert "8675309123" not in done.stderr

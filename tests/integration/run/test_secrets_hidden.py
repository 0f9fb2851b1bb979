"""Secrets never shown, through the real CLI and a running daemon: a password inside a URL
is masked in every error, log line, ``/status``, ``traind status`` and the status page, and an
API key on a child's command line in its log; an S3 endpoint with a password is refused,
masked; a secret of the wrong type is not echoed by ``traind check-config``."""

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

PASSWORD = "pa55-in-the-url"
KEY = "wJalrXUtnFEMI-the-secret-key"
API_KEY = "sk-the-services-api-key"
HEALTH = "http://probe:{}@127.0.0.1:{}/health"


def traind(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, within 60 s."""
    return subprocess.run([sys.executable, "-m", "traind", *args], capture_output=True,
                          text=True, timeout=60, check=False)


SERVICE = """
import http.server, sys
class Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", "http://probe:pa55-in-the-location@127.0.0.1:1/health")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Redirect).serve_forever()
"""
"""A service whose health URL answers with a redirect (a wrong path: reported as an error)."""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config with a local store and a service whose health URL, and the redirect it
    answers with, hold a password, and whose command line holds an API key."""
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    port = free_port()
    argv = [sys.executable, str(script), str(port), "--api-key", API_KEY]
    service = (f'[[services]]\nname = "env-server"\ncommand = {json.dumps(argv)}\n'
               f'health = {{ url = "{HEALTH.format(PASSWORD, port)}", interval = "200ms" }}\n')
    return write_config(tmp_path / "traind.toml", run="exp", output_dir=tmp_path / "out",
                        state_dir=tmp_path / "state",
                        storage=f'type = "local"\npath = "{tmp_path / "store"}"\n',
                        extra=service)


@pytest.fixture
def daemon(config: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """traind with that service, once its health check reported the redirect; its status
    URL. Stopped on the way out."""
    proc = DaemonProcess(config)
    try:
        listen = proc.wait_for("status_server_started", timeout=60)["listen"]
        proc.wait_for("health_redirect", timeout=60)
        yield proc, f"http://{listen}"
    finally:
        proc.stop(timeout=30)


def get(url: str) -> str:
    """The body at ``url``, within 5 s."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_a_password_in_a_url_is_shown_nowhere(
    daemon: tuple[DaemonProcess, str], config: Path
) -> None:
    """/status, the page, ``traind status`` and the daemon's log name the health URL with
    its password masked, and show neither it, the redirect's, nor the service's API key."""
    proc, url = daemon
    masked = "http://probe:***@127.0.0.1:"
    status = json.loads(get(f"{url}/status"))
    assert any(masked in e["message"] for e in status["errors"]), status["errors"]
    page = get(f"{url}/")
    assert masked in page
    shown = traind("status", "-c", str(config))
    assert shown.returncode == 0, shown.stderr
    assert masked in shown.stdout
    as_json = traind("status", "--json", "-c", str(config))
    proc.stop(timeout=30)
    logged = "".join(proc.raw)
    assert masked in logged
    assert proc.named("child_started")[0]["argv"][-2:] == ["--api-key", "***"]
    for seen in (json.dumps(status), page, shown.stdout + shown.stderr,
                 as_json.stdout + as_json.stderr, logged):
        assert PASSWORD not in seen
        assert "pa55-in-the-location" not in seen
        assert API_KEY not in seen


def test_an_s3_endpoint_with_a_password_is_refused_masked(tmp_path: Path) -> None:
    """An S3 endpoint URL holding a user and password (never usable: requests are signed)
    is refused by every command, the password masked."""
    storage = (f'type = "s3"\nbucket = "ckpts"\n'
               f'endpoint_url = "http://admin:{PASSWORD}@127.0.0.1:{free_port()}"\n'
               f'access_key_id = "AKIAEXAMPLE"\nsecret_access_key = "{KEY}"\n')
    cfg = write_config(tmp_path / "traind.toml", run="exp", output_dir=tmp_path / "out",
                       state_dir=tmp_path / "state", storage=storage)
    for args in (["check-config"], ["list"], ["run"]):
        done = traind(*args, "-c", str(cfg))
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "storage.endpoint_url = 'http://admin:***@127.0.0.1:" in done.stderr
        assert "must not hold a user or password" in done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        assert KEY not in done.stdout + done.stderr


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

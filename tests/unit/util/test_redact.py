"""The redaction helper: credentials in URLs, command lines and log fields are masked, and
nothing else is changed."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from traind.util import logs, redact


@pytest.mark.parametrize(("given", "shown"), [
    ("http://user:hunter2@host:8333", "http://user:***@host:8333"),
    ("https://u:p@ss:w0rd@host/path?x=1", "https://u:***@host/path?x=1"),
    ("http://user:@host", "http://user:***@host"),
    ("http://host:8333/b?token=abc&part=1", "http://host:8333/b?token=***&part=1"),
    ("https://s3/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=f00&X-Amz-Expires=60#frag",
     "https://s3/k?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60#frag"),
    ("https://console.vast.ai/api/v0/?api_key=k1&q=%7B%7D",
     "https://console.vast.ai/api/v0/?api_key=***&q=%7B%7D"),
])
def test_a_url_loses_its_password_and_credential_parameters(given: str, shown: str) -> None:
    """The userinfo's password and query values named like credentials become the mask."""
    assert redact.url(given) == shown


@pytest.mark.parametrize("kept", [
    "ssh://ubuntu@gpu-host:22/~/ckpts/run",
    "hf://org/repo@main/runs/",
    "s3://bucket/prefix/run/",
    "http://127.0.0.1:8001/health",
    "https://host/p?q=1&name=a",
    "/data/out/checkpoint-300",
    "",
])
def test_what_holds_no_credential_is_unchanged(kept: str) -> None:
    """A user without a password, an @ after the host, paths: all shown as they are."""
    assert redact.url(kept) == kept
    assert redact.text(kept) == kept


def test_every_url_inside_text_is_masked() -> None:
    """An error message carrying URLs (botocore's, aiohttp's, quoted or not) shows none of
    their secrets and keeps the rest of its words."""
    said = ('Could not connect to the endpoint URL: "http://k:s3cr3t@127.0.0.1:1/b" '
            "(400, url='https://h/x?access_token=t0k3n') at http://a:b@c")
    shown = redact.text(said)
    for secret in ("s3cr3t", "t0k3n", ":b@"):
        assert secret not in shown
    assert shown == ('Could not connect to the endpoint URL: "http://k:***@127.0.0.1:1/b" '
                     "(400, url='https://h/x?access_token=***') at http://a:***@c")


def test_a_command_line_hides_its_credential_options() -> None:
    """``--api-key KEY``, ``--hf-token=KEY`` and a URL's password are masked in an argv,
    and nothing else (``--tokenizer`` names a model)."""
    argv = ["vllm", "serve", "Qwen/Qwen2.5-0.5B", "--api-key", "sk-1", "--hf-token=hf_2",
            "--endpoint", "http://u:pw@h:1", "--port", "8001", "--tokenizer", "t"]
    assert redact.argv(argv) == [
        "vllm", "serve", "Qwen/Qwen2.5-0.5B", "--api-key", "***", "--hf-token=***",
        "--endpoint", "http://u:***@h:1", "--port", "8001", "--tokenizer", "t"]


@pytest.mark.parametrize(("name", "secret"), [
    ("secret_access_key", True), ("HF_TOKEN", True), ("WANDB_API_KEY", True),
    ("X-Amz-Signature", True), ("DB_PASSWORD", True), ("CUDA_VISIBLE_DEVICES", False),
    ("PYTHONPATH", False), ("region", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    """Which variable, key or parameter names mark a credential."""
    assert redact.secret_name(name) is secret


def test_every_log_line_is_masked() -> None:
    """A log field with a URL in it (a string, or strings in a list) is masked in the
    rendered line, whatever logged it."""
    out = io.StringIO()
    logs.configure(out, json=True)
    try:
        structlog.get_logger("t").error(
            "store_unreachable", error="cannot reach http://u:hunter2@h:1",
            argv=["x", "https://h/?token=hunter3"], n=3)
    finally:
        structlog.reset_defaults()
    line = json.loads(out.getvalue())
    assert line["error"] == "cannot reach http://u:***@h:1"
    assert line["argv"] == ["x", "https://h/?token=***"]
    assert "hunter" not in out.getvalue()

"""Secrets kept out of what traind prints: every config value, URL or message that may hold
one (an error, a log line, ``/status``, the page) passes through here first.

A URL keeps its scheme, user, host, port and path; the password of its userinfo
(``http://user:pass@host``) and the values of query parameters named like a credential
(``?token=``, ``X-Amz-Signature=``) become ``MASK``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MASK = "***"
"""What stands where a secret was."""

_SECRET_WORDS = re.compile(
    r"token|secret|passw|pwd|api[_-]?key|access[_-]?key|private[_-]?key|credential|"
    r"signature|auth|cookie",
    re.IGNORECASE,
)
"""A part of a name (a config key, a variable, a query parameter, an option) that says its
value is a credential."""

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
"""A URL inside text: up to whitespace or a quote around it."""

_USERINFO = re.compile(r"^([^:/?#]+://)([^/?#@:]*):([^/?#]*)@")
"""``scheme://user:password@``: what stands before the host when it holds a password (up
to the authority's last ``@``, as a URL parser splits it)."""

_QUERY_PAIR = re.compile(r"([?&;])([^=&;#]+)=([^&;#]*)")

_SECRET_OPTION = re.compile(
    r"^(--?[A-Za-z0-9-]*(?:token|secret|password|passwd|api-?key|access-key|credentials?))"
    r"(=.*)?$",
    re.IGNORECASE,
)
"""A command-line option whose value is a credential (``--api-key``, ``--hf-token=...``;
not ``--tokenizer``)."""


def secret_name(name: str) -> bool:
    """Whether a key, variable or parameter named ``name`` holds a credential
    (``secret_access_key``, ``HF_TOKEN``, ``X-Amz-Signature``)."""
    return _SECRET_WORDS.search(name) is not None


def url(value: str) -> str:
    """``value`` with the password in its userinfo and every credential in its query masked;
    anything that is not such a URL comes back unchanged."""
    value = _USERINFO.sub(lambda m: f"{m[1]}{m[2]}:{MASK}@", value, count=1)
    if "?" not in value:
        return value
    head, _, rest = value.partition("?")
    masked = _QUERY_PAIR.sub(
        lambda m: f"{m[1]}{m[2]}={MASK}" if secret_name(m[2]) else m[0], "?" + rest
    )
    return head + masked


def text(value: str) -> str:
    """``value`` (a message, an exception's text, a log field) with every URL in it
    masked as ``url`` does."""
    if "://" not in value:
        return value
    return _URL.sub(lambda m: url(m[0]), value)


def argv(args: Sequence[str]) -> list[str]:
    """A command line fit to log: URLs masked, and the value of an option named like a
    credential (``--api-key KEY``, ``--hf-token=KEY``) replaced by ``MASK``."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            shown.append(MASK)
            hide_next = False
            continue
        option = _SECRET_OPTION.match(arg)
        if option and option[2] is not None:
            shown.append(f"{option[1]}={MASK}")
        else:
            hide_next = option is not None
            shown.append(text(arg))
    return shown

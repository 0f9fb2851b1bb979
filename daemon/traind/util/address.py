"""Where the status server listens: ``host:port`` or ``unix:/path``. No I/O, no aiohttp,
so the config can validate it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_LISTEN = "127.0.0.1:9750"
"""Where the status server listens unless ``[status] listen`` says otherwise."""


@dataclass(frozen=True)
class TCPAddress:
    """``host:port`` (``[::1]:9750`` for IPv6)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class UnixAddress:
    """``unix:/path/to.sock``."""

    path: Path

    def __str__(self) -> str:
        return f"unix:{self.path}"


def parse_listen(listen: str) -> TCPAddress | UnixAddress:
    """Parse a ``listen`` string; ValueError says what is wrong with a bad one."""
    if listen.startswith("unix:"):
        path = listen.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"{listen!r}: a unix socket needs an absolute path, unix:/path")
        return UnixAddress(Path(path))
    host, sep, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{listen!r}: write host:port (127.0.0.1:9750) or unix:/path/to.sock")
    return TCPAddress(host, int(port))

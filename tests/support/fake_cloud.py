"""What the cloud stand-ins share: serving an aiohttp app on loopback, and the "rented host"
every instance really is — a real sshd on loopback whose ``authorized_keys`` receives the key
the provider was asked to install, the moment the instance starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aiohttp import web


@dataclass
class LoopbackHost:
    """Where every instance's SSH answers, and the authorized_keys its provider fills."""

    host: str = "127.0.0.1"
    port: int = 22
    authorized_keys: Path | None = None

    def install_key(self, public_key: str) -> None:
        """Put ``public_key`` where the instance's sshd reads it (as cloud-init or the
        provider's agent would)."""
        if self.authorized_keys is None or not public_key.strip():
            return
        present = self.authorized_keys.read_text() if self.authorized_keys.exists() else ""
        if public_key.strip() not in present.splitlines():
            with open(self.authorized_keys, "a") as f:
                f.write(public_key.strip() + "\n")


class Serving:
    """``async with Serving(app) as url:`` serves ``app`` on a free loopback port."""

    def __init__(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, access_log=None)

    async def __aenter__(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

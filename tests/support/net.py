"""Free loopback ports for the servers tests start, and loopback servers for a handler
(a raw stream one, and an aiohttp one for proxies in front of a real server)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct loopback ports that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """Serve ``handler`` on a free loopback port for the block; yield its ``http://`` URL."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)


@contextlib.asynccontextmanager
async def forwarding(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """Serve ``handle`` for every route on a free loopback port for the block; yield its
    ``http://`` URL and a client session for forwarding upstream (bodies left encoded)."""
    app = web.Application(client_max_size=1024 ** 3)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            await site.start()
            yield f"http://127.0.0.1:{runner.addresses[0][1]}", session
    finally:
        await runner.cleanup()

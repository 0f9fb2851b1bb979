"""``traind status``: ask the running daemon for ``/status`` and show it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TextIO, cast

import aiohttp

from traind.errors import TraindError
from traind.status.model import StatusSnapshot
from traind.status.render import render
from traind.util.address import TCPAddress, parse_listen

NOT_RUNNING = 3  # the LSB exit code for "program is not running", as systemctl status uses
CLEAR = "\x1b[H\x1b[2J"
ANSWER_WITHIN = 5.0  # seconds; a daemon slower than this is reported as not answering
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class DaemonUnreachableError(TraindError):
    """No traind answers at the status address."""


async def fetch_status(listen: str) -> StatusSnapshot:
    """GET ``/status`` from the daemon listening at ``listen``; DaemonUnreachableError if
    nothing answers, TraindError if it answers with an error."""
    address = parse_listen(listen)
    connector: aiohttp.BaseConnector
    if isinstance(address, TCPAddress):
        host = _WILDCARDS.get(address.host, address.host)
        url = f"http://{TCPAddress(host, address.port)}/status"
        connector = aiohttp.TCPConnector()
    else:
        url = "http://traind/status"
        connector = aiohttp.UnixConnector(path=str(address.path))
    unreachable = (
        f"no traind answering at {address} — is the service running? `systemctl status traind`"
    )
    try:
        async with (
            aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=ANSWER_WITHIN)
            ) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                text = (await response.text())[:500]
                raise TraindError(f"traind at {address} answered {response.status}: {text}")
            return cast(StatusSnapshot, await response.json())
    except TimeoutError as exc:
        late = f"{unreachable} (no answer within {ANSWER_WITHIN:g}s)"
        raise DaemonUnreachableError(late) from exc
    except aiohttp.ClientConnectorError as exc:
        reason = exc.os_error.strerror or str(exc.os_error)
        raise DaemonUnreachableError(f"{unreachable} ({reason.lower()})") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise DaemonUnreachableError(f"{unreachable} ({exc})") from exc


async def status_command(
    listen: str, as_json: bool, watch: float | None, out: TextIO | None = None,
    found: str = "",
) -> int:
    """Print the daemon's status once (exit 0, or 3 when it is not running), or every
    ``watch`` seconds until interrupted; errors go to stderr, naming where the address was
    ``found`` when it is not the config's."""
    out = out or sys.stdout
    redraw = watch is not None and not as_json and out.isatty()
    while True:
        try:
            status = await fetch_status(listen)
        except TraindError as exc:
            if watch is None:
                print(f"traind: {exc}" + (f" (address: {found})" if found else ""),
                      file=sys.stderr)
                return NOT_RUNNING if isinstance(exc, DaemonUnreachableError) else 1
            out.write(CLEAR if redraw else "")
            out.flush()
            print(f"traind: {exc} (retrying every {watch:g}s)", file=sys.stderr)
        else:
            if as_json:  # one document per line when watching: JSON lines for scripts
                text = json.dumps(status, indent=None if watch is not None else 2) + "\n"
            else:
                text = render(status)
            out.write((CLEAR if redraw else "") + text)
            out.flush()
        if watch is None:
            return 0
        await asyncio.sleep(watch)

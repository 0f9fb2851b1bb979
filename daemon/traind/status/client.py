"""``traind status``: ask the running daemon for ``/status`` and show it.

One GET at a time needs no event loop: this uses the standard library's blocking HTTP client,
so the command imports neither asyncio nor aiohttp and starts as fast as a command typed
often should.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from typing import TextIO, cast

from traind.errors import TraindError
from traind.status.model import StatusSnapshot
from traind.status.render import render
from traind.util.address import TCPAddress, parse_listen
from traind.util.jsontext import strict_json

NOT_RUNNING = 3  # the LSB exit code for "program is not running", as systemctl status uses
CLEAR = "\x1b[H\x1b[2J"
ANSWER_WITHIN = 5.0  # seconds; a daemon slower than this is reported as not answering
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class DaemonUnreachableError(TraindError):
    """No traind answers at the status address."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the daemon's unix socket (``listen = "unix:/path"``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("traind", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def fetch_status(listen: str) -> StatusSnapshot:
    """GET ``/status`` from the daemon listening at ``listen``; DaemonUnreachableError if
    nothing answers, TraindError if it answers with an error."""
    address = parse_listen(listen)
    conn: http.client.HTTPConnection
    if isinstance(address, TCPAddress):
        host = _WILDCARDS.get(address.host, address.host)
        conn = http.client.HTTPConnection(host, address.port, timeout=ANSWER_WITHIN)
    else:
        conn = _UnixConnection(str(address.path), ANSWER_WITHIN)
    unreachable = (
        f"no traind answering at {address} — is the service running? `systemctl status traind`"
    )
    try:
        conn.request("GET", "/status")
        response = conn.getresponse()
        body = response.read()
    except TimeoutError as exc:
        late = f"{unreachable} (no answer within {ANSWER_WITHIN:g}s)"
        raise DaemonUnreachableError(late) from exc
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DaemonUnreachableError(f"{unreachable} ({reason.lower()})") from exc
    except http.client.HTTPException as exc:
        raise DaemonUnreachableError(f"{unreachable} ({exc or type(exc).__name__})") from exc
    finally:
        conn.close()
    if response.status != 200:
        text = body.decode(errors="replace")[:500]
        raise TraindError(f"traind at {address} answered {response.status}: {text}")
    try:
        return cast(StatusSnapshot, json.loads(body))
    except ValueError as exc:
        raise TraindError(f"traind at {address} answered what is not JSON: {exc}") from exc


def status_command(
    listen: str, as_json: bool, watch: float | None, out: TextIO | None = None,
    found: str = "", first: StatusSnapshot | None = None,
) -> int:
    """Print the daemon's status once (exit 0, or 3 when it is not running), or every
    ``watch`` seconds until interrupted; errors go to stderr, naming where the address was
    ``found`` when it is not the config's. ``first``: an answer already fetched, shown first."""
    out = out or sys.stdout
    redraw = watch is not None and not as_json and out.isatty()
    while True:
        try:
            status = first if first is not None else fetch_status(listen)
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
                text = strict_json(status, indent=None if watch is not None else 2) + "\n"
            else:
                text = render(status)
            out.write((CLEAR if redraw else "") + text)
            out.flush()
        first = None
        if watch is None:
            return 0
        time.sleep(watch)

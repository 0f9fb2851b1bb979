"""Structured logs: JSON lines when not on a TTY (journald), readable console on a TTY."""

from __future__ import annotations

import sys
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from traind.util import redact

if TYPE_CHECKING:
    from structlog.typing import Processor

FORMATS = ("json", "console")
CLEAR_LINE = "\r\x1b[K"
"""Written before each log line on a terminal: a progress bar drawn there (no newline yet) is
wiped, so a log line never shares its line."""


def configure(
    stream: TextIO | None = None,
    *,
    json: bool | None = None,
    level: str = "info",
    processors: Sequence[Processor] = (),
) -> None:
    """Configure structlog for the process.

    ``stream`` defaults to stdout (the daemon's journal); ``json`` defaults to "not a TTY";
    ``processors`` run just before rendering (e.g. to keep recent errors for ``/status``).
    """
    import logging

    import structlog  # here: a command that logs nothing (``traind status``) never imports it

    out = stream or sys.stdout
    tty = out.isatty()
    as_json = not tty if json is None else json
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=tty)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redacted,
            *processors,
            renderer,
            *([_clear_line] if tty else []),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def redacted(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor masking the credentials of every URL in the event's text fields
    (``traind.util.redact``): whatever a message or a library's error carried, no log line,
    and no error kept for ``/status``, shows a password."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact.text(value)
        elif isinstance(value, list | tuple) and any(isinstance(v, str) for v in value):
            event[key] = [redact.text(v) if isinstance(v, str) else v for v in value]
    return event


def _clear_line(_: Any, __: str, line: Any) -> Any:
    """Start a rendered line on a terminal by wiping what a progress bar left there."""
    return CLEAR_LINE + line

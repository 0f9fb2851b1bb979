"""Structured logs: JSON lines when not on a TTY (journald), readable console on a TTY."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TextIO

import structlog


def configure(
    stream: TextIO | None = None,
    *,
    json: bool | None = None,
    level: str = "info",
    processors: Sequence[structlog.typing.Processor] = (),
) -> None:
    """Configure structlog for the process.

    ``stream`` defaults to stdout (the daemon's journal); ``json`` defaults to "not a TTY";
    ``processors`` run just before rendering (e.g. to keep recent errors for ``/status``).
    """
    out = stream or sys.stdout
    as_json = not out.isatty() if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *processors,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )

"""Concurrency for backends: a TaskGroup whose failure is one error, not an ExceptionGroup.

The streamer and the CLI expect a StorageError (or the cancellation) itself. When several
tasks fail at once, a permanent error wins over a transient one, so the caller does not
retry what cannot succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from traind.errors import TransientStorageError


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """``asyncio.TaskGroup`` raising the most telling failure of its tasks by itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            yield tg
    except BaseExceptionGroup as group:
        errors = [e for e in _leaves(group) if not isinstance(e, asyncio.CancelledError)]
        permanent = [e for e in errors if not isinstance(e, TransientStorageError)]
        chosen = (permanent or errors or list(group.exceptions))[0]
        raise chosen from chosen.__cause__


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found

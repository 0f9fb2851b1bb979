"""Reaching the store at start-up: a store that is down for now is waited for, unless the
trainer can resume from output_dir without it."""

from __future__ import annotations

import structlog

from traind.app.observe import Observer
from traind.checkpoints.restore import recovery
from traind.checkpoints.state.journal import Journal
from traind.config import Settings
from traind.errors import TransientStorageError
from traind.layout.manifest import Manifest
from traind.protocol import CheckpointStore
from traind.util.retry import Backoff, retrying

log = structlog.get_logger("traind.app")

STORE_RETRY = (1.0, 60.0)
"""Waiting for a store that cannot be reached: the first pause and the cap, in seconds."""
WAITING_HINT = ("waiting for the store before the trainer starts: output_dir holds no "
                "checkpoint to resume from, and the store may hold a newer one")


async def first_manifests(storage: CheckpointStore, journal: Journal, settings: Settings,
                          observer: Observer) -> list[Manifest] | None:
    """The store's manifests, or None when the store cannot be reached but the trainer can
    resume from output_dir without it (uploads catch up once the store answers).

    Otherwise a store that is down for now (network not up yet, server restarting) is waited
    for: on an empty output_dir the store may hold a newer checkpoint, and starting fresh
    would throw the run's progress away. A permanent error (bad credentials, no such bucket)
    ends the start-up."""
    try:
        return await storage.manifests()
    except TransientStorageError as exc:
        resume = await recovery.local_resume_point(
            journal, settings.run.output_dir, settings.checkpoints
        )
        if resume is not None:
            log.error("store_unreachable", backend=storage.describe, error=str(exc),
                      resume_from=str(resume),
                      hint="starting from the checkpoint in output_dir; uploads wait for "
                           "the store")
            return None
        log.error("store_unreachable", backend=storage.describe, error=str(exc),
                  retry_in=STORE_RETRY[0], hint=WAITING_HINT)
    observer.set_state("waiting_for_store")
    manifests = await wait_for_store(storage, WAITING_HINT, first=1)
    observer.set_state("starting")
    return manifests


async def wait_for_store(storage: CheckpointStore, hint: str,
                         first: int = 0) -> list[Manifest]:
    """The store's manifests, asked for with capped backoff until the store answers; a
    permanent error is raised. ``first`` counts the failures already reported."""
    failures = first

    def unreachable(exc: BaseException, n: int, delay: float) -> None:
        nonlocal failures
        failures = n
        log.error("store_unreachable", backend=storage.describe, error=str(exc),
                  retry_in=delay, hint=hint)

    manifests = await retrying(storage.manifests, Backoff(*STORE_RETRY), None,
                               on_retry=unreachable, failed=first)
    if failures:
        log.info("store_reachable", backend=storage.describe, failures=failures)
    return manifests

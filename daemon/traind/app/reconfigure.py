"""Applying a re-read config to a running daemon (SIGHUP): the status server and the store
are swapped only once the new one works; ``reload.plan_reload`` decides what applies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import structlog

from traind import config
from traind.app.observe import Observer
from traind.app.reload import plan_reload
from traind.checkpoints.commit.streamer import Streamer
from traind.config import Settings
from traind.errors import ConfigError, TraindError
from traind.protocol import CheckpointStore, open_storage

log = structlog.get_logger("traind.app")


async def reconfigure(path: Path, current: Settings, streamer: Streamer, observer: Observer,
                      use_storage: Callable[[CheckpointStore], None]) -> Settings | None:
    """Re-read ``path`` and apply what can change live, reporting the rest; return the
    settings to run with, or None when the file or a new part of it is refused (nothing
    changed then). A new store is probed first and handed to ``use_storage``; the upload in
    flight finishes on the old one (see ``Streamer.replace_storage``). systemd hears
    RELOADING=1 meanwhile."""
    observer.notifier.reloading()
    try:
        return await _apply(path, current, streamer, observer, use_storage)
    finally:
        observer.notifier.ready()
        observer.announce()


async def _apply(path: Path, current: Settings, streamer: Streamer, observer: Observer,
                 use_storage: Callable[[CheckpointStore], None]) -> Settings | None:
    try:
        new = await asyncio.to_thread(config.load, path)
    except ConfigError as exc:
        log.error("reload_rejected", config=str(path), problems=exc.problems)
        return None
    state_dir = current.run.state_dir
    plan = plan_reload(current, new)
    if "status" in plan.applied:
        try:
            await observer.serve(new.status, state_dir)
        except TraindError as exc:
            log.error("reload_rejected", config=str(path), problems=[f"status: {exc}"])
            await observer.serve(current.status, state_dir)
            return None
    if "storage" in plan.applied:
        storage = open_storage(new.storage, new.run.name)
        try:
            await storage.probe()
        except TraindError as exc:
            await storage.aclose()
            log.error("reload_rejected", config=str(path), problems=[f"storage: {exc}"])
            return None
        old = await streamer.replace_storage(storage)
        use_storage(storage)
        await old.aclose()
    streamer.claim_ttl = plan.effective.storage.claim_ttl
    log.info("reload_applied", applied=list(plan.applied),
             needs_restart=list(plan.needs_restart), backend=streamer.storage.describe)
    if plan.needs_restart:
        log.warning("reload_needs_restart", sections=list(plan.needs_restart),
                    hint="systemctl restart traind")
    return plan.effective

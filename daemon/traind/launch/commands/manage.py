"""Managing a saved launch: ``status``, ``logs``, ``pull`` and ``down``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import structlog

from traind.launch.base import HostState, LineSink
from traind.launch.commands.flow import (
    Context,
    layout,
    log_event,
    run_checked,
    service_active,
    step,
)
from traind.launch.commands.flow import follow as follow_log
from traind.launch.errors import LaunchError
from traind.launch.handles import LaunchRecord
from traind.launch.host import service

log = structlog.get_logger("traind.launch")


async def status(ctx: Context, record: LaunchRecord) -> dict[str, Any]:
    """The host's state, whether traind runs there, and the newest commit it logged."""
    host = await ctx.backend.status(record.handle)
    since = record.handle.created_at or record.created_at  # the host's own uptime is not ours
    uptime = time.time() - since if since else host.uptime_seconds
    facts: dict[str, Any] = {
        "name": record.name, "backend": record.handle.backend,
        "instance": record.handle.instance_id, "state": str(host.state),
        "gpu": host.gpu_name, "num_gpus": host.num_gpus,
        "uptime_seconds": None if uptime is None else round(uptime),
        "endpoint": str(host.endpoint) if host.endpoint else None,
        "price_per_hour": record.handle.price_per_hour, "message": host.message,
        "service": record.service or None, "traind": "unknown", "last_commit": None,
        "recoveries": list(record.recoveries),
    }
    if host.state is HostState.RUNNING and record.service:
        try:
            facts["traind"] = "running" if await service_active(ctx, record) else "stopped"
            lines = await run_checked(
                ctx, record.handle, service.logs(record.service, layout(record), 500, False),
                "reading traind's log", within=60,
            )
        except LaunchError as exc:
            facts["message"] = str(exc)
            return facts
        commits = [line for line in lines if log_event(line) == "checkpoint_committed"]
        facts["last_commit"] = last_commit(commits[-1]) if commits else None
    return facts


def last_commit(line: str) -> dict[str, Any]:
    """The facts of a ``checkpoint_committed`` log line: tag, step, bytes, when, ..."""
    event = json.loads(line)
    return {k: v for k, v in event.items() if k not in ("event", "level", "logger")}


async def logs(
    ctx: Context, record: LaunchRecord, lines: int, follow: bool, detach: asyncio.Event,
    out: LineSink,
) -> None:
    """Print traind's last ``lines`` log lines; with ``follow``, keep going until detached."""
    if follow:
        await follow_log(ctx, record, detach, out, lines)
        return
    for line in await run_checked(
        ctx, record.handle, service.logs(record.service, layout(record), lines, False),
        "reading traind's log", within=60,
    ):
        out(line)


async def pull(
    ctx: Context, record: LaunchRecord, tag: str = "latest", dest: Path | None = None
) -> Path:
    """Restore checkpoint ``tag`` (verified) on the host from the run's store, then copy it to
    ``dest`` (default ``<pull.dir>/<name>``); return the local checkpoint directory."""
    where = layout(record)
    async with step("pull", record.name, tag=tag) as facts:
        printed = await run_checked(
            ctx, record.handle, service.pull(where, record.python, tag),
            "traind pull on the host", env=where.env(ctx.config.run.env),
        )
        remote = printed[-1].strip() if printed else ""
        if not remote.startswith(where.pulled):
            raise LaunchError(f"traind pull on the host printed no directory: {printed[-3:]}")
        local = (dest or ctx.config.pull.dir / record.name) / remote.rsplit("/", 1)[-1]
        await ctx.backend.sync_from(record.handle, remote, local, delete=True)
        await run_checked(ctx, record.handle, ["rm", "-rf", where.pulled], "cleanup", within=120)
        facts["local"] = str(local)
    return local


async def down(ctx: Context, record: LaunchRecord, pull_first: bool = True) -> Path | None:
    """Pull the newest committed checkpoint (unless told not to), stop traind, destroy or
    release the host and forget the launch. A failed pull stops here: nothing is destroyed."""
    started = time.monotonic()
    host = await ctx.backend.status(record.handle)
    pulled = None
    if host.state is HostState.DESTROYED:
        log.warning("launch_host_already_gone", launch=record.name,
                    instance=record.handle.instance_id)
    else:
        if pull_first and record.python:
            try:
                pulled = await pull(ctx, record)
            except LaunchError as exc:
                raise LaunchError(
                    f"down stopped before destroying anything: pulling the newest checkpoint "
                    f"failed: {exc}\nretry, or skip the pull: traind launch down {record.name} "
                    "--no-pull"
                ) from exc
        elif pull_first:
            log.warning("launch_nothing_to_pull", launch=record.name,
                        reason="traind was never installed on the host")
        record = ctx.store.save(record.with_(stopping=True))  # a follower recovers no more
        if record.service:
            async with step("stop", record.name, service=record.service):
                try:
                    grace = ctx.config.install.stop_timeout
                    await run_checked(
                        ctx, record.handle, service.stop(record.service, layout(record), grace),
                        "stopping traind", within=grace + 60,
                    )
                except LaunchError as exc:
                    log.warning("launch_stop_failed", launch=record.name, error=str(exc))
    async with step("teardown", record.name, instance=record.handle.instance_id):
        await ctx.backend.teardown(record.handle)
    ctx.store.remove(record.name)
    log.info("launch_down", launch=record.name, pulled=str(pulled) if pulled else None,
             seconds=round(time.monotonic() - started, 3))
    return pulled

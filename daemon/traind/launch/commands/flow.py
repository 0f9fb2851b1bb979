"""``traind launch``: search → provision → wait → sync code and config → install traind →
start its service → follow its log until the run ends or the user detaches.

Every step logs ``launch_step step=... seconds=...``. The launch is saved as soon as a host
is provisioned, so it can always be found again. A failure after that tears the host down
(``[host] on_failure = "teardown"``) or, when that is off or fails, says loudly that it is
still there and the exact ``traind launch down NAME`` that removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

import traind
from traind.launch import recovery
from traind.launch.base import Handle, HostBackend, HostState, LineSink, RemoteResult
from traind.launch.config import LaunchConfig
from traind.launch.errors import (
    HostUnreachableError,
    LaunchError,
    NoOffersError,
    RemoteCommandError,
)
from traind.launch.handles import LaunchRecord, LaunchStore
from traind.launch.host import service
from traind.launch.host.commands import check
from traind.util.poll import poll_until

log = structlog.get_logger("traind.launch")
REACH_INTERVAL = 2.0
"""Seconds between tries of a host that does not answer yet."""
"""traind log events after which the run is over: trained, and every checkpoint committed."""
ENDED = frozenset({HostState.DESTROYED, HostState.STOPPED})
"""Host states, as the provider lists them, in which the run cannot go on."""


@dataclass(frozen=True)
class Context:
    """What every launch operation works with."""

    config: LaunchConfig
    backend: HostBackend
    store: LaunchStore


@contextlib.asynccontextmanager
async def step(name: str, launch: str, **fields: Any) -> AsyncIterator[dict[str, Any]]:
    """Time one step; log ``launch_step`` (or ``launch_step_failed``) with what it adds."""
    facts: dict[str, Any] = {}
    started = time.monotonic()
    try:
        yield facts
    except BaseException as exc:
        log.error("launch_step_failed", step=name, launch=launch, error=str(exc) or repr(exc),
                  seconds=round(time.monotonic() - started, 3), **fields)
        raise
    log.info("launch_step", step=name, launch=launch,
             seconds=round(time.monotonic() - started, 3), **fields, **facts)


def layout(record: LaunchRecord) -> service.HostPaths:
    """Where this launch's files are on its host."""
    return service.HostPaths(record.remote_root, record.name)


async def run_checked(
    ctx: Context, handle: Handle, command: str | list[str], what: str,
    env: dict[str, str] | None = None, within: float | None = None,
) -> list[str]:
    """Run a command on the host; return its stdout lines; RemoteCommandError unless it exits 0."""
    lines: list[str] = []
    result: RemoteResult = await ctx.backend.run_remote(
        handle, command, env=env, stream=lines.append,
        timeout=within or ctx.config.install.step_timeout,
    )
    check(result, what)
    return lines


async def run_for_line(ctx: Context, handle: Handle, command: str, what: str) -> str:
    """Run a command on the host that prints one answer; return its last line."""
    lines = [line for line in await run_checked(ctx, handle, command, what) if line.strip()]
    if not lines:
        raise RemoteCommandError(f"{what} printed nothing")
    return lines[-1].strip()


async def launch(ctx: Context, config_path: Path, name: str | None = None) -> LaunchRecord:
    """Bring traind up on a new host and return the saved launch (not yet followed)."""
    name = name or ctx.config.name
    if ctx.store.exists(name):
        raise LaunchError(
            f"a launch named {name!r} exists already: traind launch down {name}, or pick --name"
        )
    return await _provisioned(ctx, config_path, name)


async def _provisioned(ctx: Context, config_path: Path, name: str) -> LaunchRecord:
    """Search, provision, save and bring traind up on a new host for launch ``name``."""
    cfg = ctx.config
    public_key = _public_key(cfg)
    async with step("search", name, backend=ctx.backend.name) as facts:
        offers = await ctx.backend.search_offers(cfg.constraints.to_constraints())
        facts["offers"] = len(offers)
    if not offers:
        raise NoOffersError(f"no {ctx.backend.name} offer matches [constraints] in {config_path}")
    offer = offers[0]
    async with step("provision", name, offer=offer.id, gpu=offer.gpu_name,
                    num_gpus=offer.num_gpus, price_per_hour=offer.price_per_hour) as facts:
        handle = await ctx.backend.provision(
            offer, cfg.host.disk_gb, cfg.host.image, public_key, name
        )
        facts["instance"] = handle.instance_id
    record = ctx.store.save(LaunchRecord(
        name, str(config_path.resolve()), handle, cfg.remote_root(name), created_at=time.time()
    ))
    try:
        return await _bring_up(ctx, record)
    except BaseException as exc:
        await _abandon(ctx, record.name, exc)
        raise


async def _bring_up(ctx: Context, record: LaunchRecord) -> LaunchRecord:
    cfg, name = ctx.config, record.name
    async with step("wait_running", name, instance=record.handle.instance_id):
        handle = await ctx.backend.wait_running(record.handle, cfg.host.wait_running)
        record = ctx.store.save(record.with_(handle=handle))
    async with step("connect", name, endpoint=str(handle.endpoint or "local")):
        await _reachable(ctx, handle, cfg.host.wait_running)
    async with step("prepare", name) as facts:
        root = await run_for_line(ctx, handle, service.resolve_root(record.remote_root),
                                  "creating the launch directory")
        record = ctx.store.save(record.with_(remote_root=root))
        facts["remote_root"] = root
    where = layout(record)
    async with step("sync_code", name, source=str(cfg.run.code_dir)):
        await ctx.backend.sync_to(handle, cfg.run.code_dir, where.code, cfg.run.excludes,
                                  cfg.run.includes, delete=True)
    async with step("sync_traind", name):
        await ctx.backend.sync_to(handle, Path(traind.__file__).parent, f"{where.lib}/traind",
                                  ("__pycache__", "*.pyc"), delete=True)
        await ctx.backend.sync_to(handle, cfg.run.traind_config, where.config)
    async with step("install", name, venv=cfg.install.venv) as facts:
        python = await run_for_line(
            ctx, handle, service.install_python(where, cfg.install.python, cfg.install.venv,
                                                cfg.install.packages()), "installing python"
        )
        await run_checked(ctx, handle, service.check_config(where, python),
                          "traind check-config on the host", env=where.env(cfg.run.env))
        facts["python"] = python
    async with step("start", name) as facts:
        kind: str = cfg.install.service
        if kind == "auto":
            kind = await run_for_line(ctx, handle, service.DETECT, "detecting systemd")
        record = ctx.store.save(record.with_(service=kind, python=python))
        await run_checked(
            ctx, handle, service.start(kind, where, python, where.env(cfg.run.env),
                                       ready_within=cfg.install.step_timeout,
                                       stop_timeout=cfg.install.stop_timeout),
            "starting traind", env=where.env(cfg.run.env),
        )
        facts["service"] = kind
    log.info("launch_ready", launch=name, backend=ctx.backend.name,
             instance=handle.instance_id, service=record.service, remote_root=record.remote_root)
    return record


async def _answers(ctx: Context, handle: Handle, within: float = 30) -> LaunchError | None:
    """None when the host runs a trivial command over SSH, else why not."""
    try:
        await run_checked(ctx, handle, "true", "true", within=within)
    except (HostUnreachableError, RemoteCommandError) as exc:
        return exc
    return None


async def _reachable(ctx: Context, handle: Handle, within: float) -> None:
    """Retry a trivial command until the host answers (a fresh host's sshd starts late);
    the last error is raised once ``within`` seconds have passed."""

    async def attempt() -> LaunchError | None:
        if (failed := await _answers(ctx, handle)) is not None:
            log.info("launch_host_not_reachable_yet", instance=handle.instance_id,
                     error=str(failed))
        return failed

    if (failed := await poll_until(attempt, done=lambda e: e is None, within=within,
                                   every=REACH_INTERVAL)) is not None:
        raise HostUnreachableError(f"{failed} (still, after {within:.0f}s)") from failed


async def _lost(ctx: Context, record: LaunchRecord, error: HostUnreachableError) -> tuple[str, str]:
    """After following lost the host: look at it (the provider's listing, then SSH) until it
    answers again ("back"), its provider lists it ended ("gone"), or it has not answered for
    longer than ``[host] unreachable_after`` while listed ("dead"); with what was seen."""
    bound, handle = ctx.config.host.unreachable_after, record.handle
    lost = time.monotonic()
    log.warning("launch_host_unreachable", launch=record.name, instance=handle.instance_id,
                error=str(error), unreachable_after=bound)

    async def look() -> tuple[str, str]:
        listed = (await ctx.backend.status(handle)).state
        answers = listed not in ENDED and await _answers(ctx, handle, min(bound, 30)) is None
        seconds = time.monotonic() - lost
        return (recovery.unreachable_verdict(listed in ENDED, answers, seconds, bound),
                f"unreachable for {seconds:.0f} s while {ctx.backend.name} lists it {listed}")

    verdict, why = await poll_until(look, done=lambda v: v[0] != "waiting", within=None,
                                    every=REACH_INTERVAL)
    seconds = round(time.monotonic() - lost, 3)
    if verdict == "back":
        log.info("launch_host_reachable_again", launch=record.name,
                 instance=handle.instance_id, seconds=seconds)
    elif verdict == "dead":
        log.error("launch_host_unreachable_too_long", launch=record.name,
                  instance=handle.instance_id, seconds=seconds, unreachable_after=bound,
                  hint="destroying it; the run recovers on a new host")
    return verdict, why


def _public_key(cfg: LaunchConfig) -> str:
    path = Path(f"{cfg.host.ssh_key}.pub")
    try:
        return path.read_text().strip()
    except OSError as exc:
        if cfg.backend not in ("local", "ssh"):  # a rented host gets our key from its provider
            raise LaunchError(f"cannot read the public key {path}: {exc.strerror or exc}") from exc
        return ""


async def _abandon(ctx: Context, name: str, error: BaseException) -> None:
    """After a failure past provisioning: tear down, or say loudly what is left and how to
    remove it. Runs to the end even when the launch was cancelled."""
    record = ctx.store.load(name)
    facts = {"launch": name, "backend": ctx.backend.name,
             "instance": record.handle.instance_id, "error": str(error) or repr(error),
             "destroy_with": f"traind launch down {name} --no-pull"}
    if ctx.config.host.on_failure == "keep":
        log.error("launch_failed_host_kept", **facts)
        return
    try:
        async with asyncio.timeout(120):
            await asyncio.shield(_teardown_after_failure(ctx, record))
    except Exception as exc:
        log.critical("launch_failed_host_left_running", teardown_error=str(exc), **facts)
        return
    ctx.store.remove(name)
    log.error("launch_failed_torn_down", **facts)


async def _teardown_after_failure(ctx: Context, record: LaunchRecord) -> None:
    if record.service:
        with contextlib.suppress(LaunchError):
            await ctx.backend.run_remote(
                record.handle, service.stop(record.service, layout(record), 20), timeout=40
            )
    await ctx.backend.teardown(record.handle)


async def first_done(*aws: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Run ``aws`` until the first of them ends; cancel the others, and return them all."""
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tasks


def log_event(line: str) -> str | None:
    """The ``event`` of a traind JSON log line, or None."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return str(data.get("event")) if isinstance(data, dict) else None


async def follow(
    ctx: Context, record: LaunchRecord, detach: asyncio.Event, out: LineSink, lines: int = 50
) -> tuple[str, str]:
    """Print traind's log lines until the run finishes ("finished"), traind stops ("stopped"),
    the provider says the unreachable host ended ("gone"), the host does not answer for
    longer than ``[host] unreachable_after`` while listed ("unreachable"), or ``detach`` is
    set ("detached", the run goes on); with why, for "unreachable". A dropped connection to
    a host that answers again is followed on."""
    finished = asyncio.Event()

    def sink(line: str) -> None:
        out(line)
        if log_event(line) in recovery.FINISHED_EVENTS:
            finished.set()

    where = layout(record)
    while True:
        tail, *_ = await first_done(
            ctx.backend.run_remote(record.handle, service.logs(record.service, where, lines,
                                                               follow=True), stream=sink),
            detach.wait(), finished.wait(),
        )
        error = None if tail.cancelled() else tail.exception()
        if isinstance(error, HostUnreachableError) and not detach.is_set():
            seen, *_ = await first_done(_lost(ctx, record, error), detach.wait())
            verdict, why = ("back", "") if seen.cancelled() else seen.result()
            if verdict in ("gone", "dead"):
                return ("gone", "") if verdict == "gone" else ("unreachable", why)
        if detach.is_set():
            log.info("launch_detached", launch=record.name,
                     hint=f"the run goes on; traind launch logs {record.name} -f to follow again")
            return "detached", ""
        if finished.is_set():
            return "finished", ""
        if error is not None and not isinstance(error, HostUnreachableError):
            raise error
        if error is None and not await service_active(ctx, record):
            return ("finished", "") if await _finished_unseen(ctx, record) else ("stopped", "")
        await asyncio.sleep(1)
        lines = 0


async def _finished_unseen(ctx: Context, record: LaunchRecord) -> bool:
    """Whether the end of traind's log says the run finished: it may have while following
    had lost the host, and a finished run is no early end to recover from."""
    seen: list[str] = []
    await ctx.backend.run_remote(
        record.handle, service.logs(record.service, layout(record), 200, follow=False),
        stream=seen.append, timeout=60)
    return any(log_event(line) in recovery.FINISHED_EVENTS for line in seen)


async def follow_recovering(
    ctx: Context, record: LaunchRecord, detach: asyncio.Event, out: LineSink
) -> str:
    """Follow as ``follow`` does; when traind stopped before the run completed, or the host
    is gone or unreachable for too long, destroy the host and bring traind up on a new one
    (it restores the newest committed checkpoint), up to ``run.max_recoveries`` times."""

    async def wait_end(current: LaunchRecord) -> recovery.Ending:
        progress = recovery.Progress()

        def sink(line: str) -> None:
            progress.see(line)
            out(line)

        state, why = await follow(ctx, current, detach, sink)
        if state in ("stopped", "gone"):
            host = await ctx.backend.status(current.handle)
            why = (f"traind ended before run_complete; the provider lists the host "
                   f"{host.state}: {host.message or '-'}")
        return progress.ending(state, why)

    return await recovery.follow_recovering(
        ctx.store, record, ctx.config.run.max_recoveries, wait_end,
        lambda r: _destroyed(ctx, r),
        lambda r: _provisioned(ctx, Path(r.config_path), r.name))


async def _destroyed(ctx: Context, record: LaunchRecord) -> None:
    """Stop traind and destroy the host; confirm through the provider that it is gone."""
    async with asyncio.timeout(120):
        await asyncio.shield(_teardown_after_failure(ctx, record))
    host = await ctx.backend.status(record.handle)
    if host.state not in ENDED:
        raise LaunchError(f"{ctx.backend.name} still lists {record.handle.instance_id} as "
                          f"{host.state} after destroying it")
    log.info("launch_host_destroyed", launch=record.name, instance=record.handle.instance_id)


async def service_active(ctx: Context, record: LaunchRecord) -> bool:
    """Whether traind runs on the host."""
    result = await ctx.backend.run_remote(
        record.handle, service.is_active(record.service, layout(record)), timeout=60
    )
    return result.exit_code == 0

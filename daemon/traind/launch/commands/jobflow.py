"""``traind launch`` on a container-job platform: submit a job running ``traind run`` →
wait until it runs → follow its log until it ends; ``status``, ``logs``, ``pull`` and ``down``.

The job's image has traind installed; its config reaches it as the platform secret
``TRAIND_CONFIG_TOML`` (it may hold store credentials), written to a file by the command
before ``traind run`` replaces the shell. The names in ``secrets`` go along as platform
secrets, never as plain environment. The job's disk is gone when it ends, so ``pull`` runs
``traind pull`` here, from the run's store. The launch is saved once the job is submitted; a
failure after that cancels it and checks through the platform's listing that nothing of the
launch is left running.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from traind.launch import recovery
from traind.launch.base import Handle, LineSink
from traind.launch.commands.flow import first_done, log_event, step
from traind.launch.commands.manage import last_commit
from traind.launch.config import LaunchConfig
from traind.launch.errors import LaunchError
from traind.launch.handles import LaunchRecord, LaunchStore
from traind.launch.jobs import JobBackend, JobSpec, JobState, JobStatus
from traind.util.poll import poll_until
from traind.util.proc import child

log = structlog.get_logger("traind.launch")
CONFIG_SECRET = "TRAIND_CONFIG_TOML"
ENTRY = ('f=$(mktemp) && printf "%s\\n" "$TRAIND_CONFIG_TOML" > "$f" && '
         'exec "$0" --log-format json -c "$f" run')
"""The job's shell: the config to a file, then ``traind run`` in the shell's place (PID 1)."""


@dataclass(frozen=True)
class Context:
    """What every job-launch operation works with."""

    config: LaunchConfig
    backend: JobBackend
    store: LaunchStore


def job_spec(cfg: LaunchConfig, name: str, environ: dict[str, str]) -> JobSpec:
    """The job of launch ``name``: its secrets' values from ``environ``, each one required."""
    jobs = cfg.job_section()
    missing = [key for key in jobs.secrets if not environ.get(key)]
    if missing:
        raise LaunchError(f"[{cfg.backend.replace('-', '_')}] secrets names "
                          f"{', '.join(missing)}, not set here: set it in the environment, "
                          "or leave it out of secrets")
    try:
        toml = cfg.run.traind_config.read_text()
    except OSError as exc:
        raise LaunchError(f"cannot read {cfg.run.traind_config}: {exc.strerror}") from exc
    secrets = {key: environ[key] for key in jobs.secrets} | {CONFIG_SECRET: toml}
    return JobSpec(
        image=jobs.image, command=("sh", "-c", ENTRY, jobs.traind), label=name,
        env={**cfg.run.env, "PYTHONUNBUFFERED": "1"}, secrets=secrets, flavor=jobs.hardware(),
        timeout=jobs.timeout, labels=jobs.labels,
    )


async def launch(ctx: Context, config_path: Path, name: str | None = None) -> LaunchRecord:
    """Submit the job and wait until it runs; return the saved launch (not yet followed)."""
    name = name or ctx.config.name
    if ctx.store.exists(name):
        raise LaunchError(
            f"a launch named {name!r} exists already: traind launch down {name}, or pick --name"
        )
    return await _started(ctx, LaunchRecord(name, str(config_path.resolve()),
                                            Handle(ctx.backend.name, "", name),
                                            "", service="job", created_at=time.time()))


async def _started(ctx: Context, record: LaunchRecord) -> LaunchRecord:
    """Submit ``record``'s job, save the record with its handle, and wait until it runs."""
    name = record.name
    spec = job_spec(ctx.config, name, dict(os.environ))
    async with step("submit", name, backend=ctx.backend.name, image=spec.image,
                    flavor=spec.flavor) as facts:
        handle = await ctx.backend.submit(spec)
        facts["instance"] = handle.instance_id
    record = ctx.store.save(record.with_(handle=handle))
    try:
        async with step("wait_running", name, instance=handle.instance_id) as facts:
            status = await poll_until(lambda: ctx.backend.inspect(handle),
                                      done=lambda s: s.state is not JobState.PENDING,
                                      within=ctx.config.host.wait_running,
                                      every=ctx.config.job_section().poll_interval)
            facts["state"] = str(status.state)
            if status.state is JobState.PENDING:
                raise LaunchError(f"job {handle.instance_id} still waits to be scheduled "
                                  f"after {ctx.config.host.wait_running:.0f}s")
            if status.state.ended and status.state is not JobState.COMPLETED:
                raise LaunchError(f"job {handle.instance_id} ended {status.state} before "
                                  f"traind ran: {status.message or 'no reason given'}")
    except BaseException as exc:
        await _abandon(ctx, record, exc)
        raise
    log.info("launch_ready", launch=name, backend=ctx.backend.name, instance=handle.instance_id,
             remote_root="", service="job")
    return record


async def _abandon(ctx: Context, record: LaunchRecord, error: BaseException) -> None:
    """Cancel the job and confirm nothing of the launch runs; runs to the end when cancelled."""
    facts = {"launch": record.name, "backend": ctx.backend.name,
             "instance": record.handle.instance_id, "error": str(error) or repr(error),
             "destroy_with": f"traind launch down {record.name} --no-pull"}
    if ctx.config.host.on_failure == "keep":
        log.error("launch_failed_host_kept", **facts)
        return
    try:
        await child.uninterrupted(_cancelled(ctx, record))
    except LaunchError as exc:
        log.critical("launch_failed_host_left_running", teardown_error=str(exc), **facts)
        return
    ctx.store.remove(record.name)
    log.error("launch_failed_torn_down", **facts)


async def _cancelled(ctx: Context, record: LaunchRecord) -> None:
    """Cancel the launch's job, then wait until the platform lists none of its jobs running."""
    await ctx.backend.cancel(record.handle)
    left = await poll_until(lambda: ctx.backend.running(record.name), done=lambda ids: not ids,
                            within=ctx.config.job_section().cancel_timeout,
                            every=ctx.config.job_section().poll_interval)
    if left:
        raise LaunchError(f"{ctx.backend.name} still lists {', '.join(left)} as running "
                          f"{ctx.config.job_section().cancel_timeout:.0f}s after cancelling")
    log.info("launch_job_cancelled", backend=ctx.backend.name, instance=record.handle.instance_id)


async def follow(
    ctx: Context, record: LaunchRecord, detach: asyncio.Event, out: LineSink,
    lines: int | None = None,
) -> str:
    """Print the job's log (its last ``lines``, else all) until the job ends — "finished" when
    it completed, else why it ended — or ``detach`` is set ("detached", the job goes on)."""
    return (await _ending(ctx, record, detach, out, lines)).state


async def follow_recovering(
    ctx: Context, record: LaunchRecord, detach: asyncio.Event, out: LineSink
) -> str:
    """Follow the job as ``follow`` does; when it ends before its trainer finished, cancel it
    and run the next one with the same spec (it restores the newest committed checkpoint), up
    to ``run.max_recoveries`` times. "finished", "detached" or "taken down" (by ``down``)."""

    return await recovery.follow_recovering(
        ctx.store, record, ctx.config.run.max_recoveries,
        lambda r: _ending(ctx, r, detach, out), lambda r: _cancelled(ctx, r),
        lambda r: _started(ctx, r))


async def _ending(
    ctx: Context, record: LaunchRecord, detach: asyncio.Event, out: LineSink,
    lines: int | None = None,
) -> recovery.Ending:
    """Print the job's log until it ends or ``detach`` is set; how it ended."""
    progress = recovery.Progress()

    async def read() -> None:
        async for line in ctx.backend.logs(record.handle, follow=True, tail=lines):
            progress.see(line)
            out(line)

    reader, _ = await first_done(read(), detach.wait())
    if detach.is_set():
        log.info("launch_detached", launch=record.name,
                 hint=f"the job goes on; traind launch logs {record.name} -f to follow again")
        return progress.ending("detached", "")
    if (error := reader.exception()) is not None:
        raise error
    status = await poll_until(lambda: ctx.backend.inspect(record.handle),
                              done=lambda s: s.state.ended, within=60,
                              every=ctx.config.job_section().poll_interval)
    log.info("launch_job_ended", launch=record.name, instance=record.handle.instance_id,
             state=str(status.state), message=status.message)
    return progress.job_ending(status.state is JobState.COMPLETED, str(status.state),
                               status.message)


async def status(ctx: Context, record: LaunchRecord) -> dict[str, Any]:
    """The job's state and why it ended, and the newest commit its log shows."""
    job: JobStatus = await ctx.backend.inspect(record.handle)
    commits = [line async for line in ctx.backend.logs(record.handle, follow=False, tail=500)
               if log_event(line) == "checkpoint_committed"]
    return {
        "name": record.name, "backend": record.handle.backend,
        "instance": record.handle.instance_id, "state": str(job.state), "message": job.message,
        "flavor": job.flavor, "url": job.url, "running_seconds": job.running_seconds,
        "last_commit": last_commit(commits[-1]) if commits else None,
        "recoveries": list(record.recoveries),
    }


async def logs(
    ctx: Context, record: LaunchRecord, lines: int, follow_on: bool, detach: asyncio.Event,
    out: LineSink,
) -> None:
    """Print the job's last ``lines`` log lines; with ``follow_on``, until it ends or detached."""
    if follow_on:
        await follow(ctx, record, detach, out, lines)
        return
    async for line in ctx.backend.logs(record.handle, follow=False, tail=lines):
        out(line)


async def pull(
    ctx: Context, record: LaunchRecord, tag: str = "latest", dest: Path | None = None
) -> Path:
    """``traind pull`` here from the run's store (the job's disk is gone): checkpoint ``tag``,
    verified, into ``dest`` (default ``<pull.dir>/<name>``), replacing an older copy."""
    parent = dest or ctx.config.pull.dir / record.name
    async with step("pull", record.name, tag=tag) as facts:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=parent))
        try:
            argv = [sys.executable, "-m", "traind", "-c", str(ctx.config.run.traind_config),
                    "pull", tag, str(staging)]
            proc = await child.spawn(argv, stdout=asyncio.subprocess.PIPE,
                                     stderr=asyncio.subprocess.PIPE)
            async with child.stopped_on_error(proc, child.KILL_GRACE):
                printed, said = await proc.communicate()
            if proc.returncode != 0:
                raise LaunchError(f"traind pull failed: {said.decode(errors='replace').strip()}")
            pulled = Path(printed.decode().strip().splitlines()[-1])
            local = parent / pulled.name
            await asyncio.to_thread(shutil.rmtree, local, True)
            pulled.rename(local)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        facts["local"] = str(local)
    return local


async def down(ctx: Context, record: LaunchRecord, pull_first: bool = True) -> Path | None:
    """Pull the newest committed checkpoint (unless told not to), cancel the job, confirm
    through the platform's listing that nothing of the launch runs, and forget the launch.
    A failed pull stops here: nothing is cancelled."""
    started = time.monotonic()
    pulled = None
    if pull_first:
        try:
            pulled = await pull(ctx, record)
        except LaunchError as exc:
            raise LaunchError(
                f"down stopped before cancelling anything: pulling the newest checkpoint "
                f"failed: {exc}\nretry, or skip the pull: traind launch down {record.name} "
                "--no-pull"
            ) from exc
    record = ctx.store.save(record.with_(stopping=True))  # a follower recovers no more
    async with step("teardown", record.name, instance=record.handle.instance_id):
        await _cancelled(ctx, record)
    ctx.store.remove(record.name)
    log.info("launch_down", launch=record.name, pulled=str(pulled) if pulled else None,
             seconds=round(time.monotonic() - started, 3))
    return pulled


"""A Hugging Face Jobs stand-in (aiohttp on loopback), reached through ``HF_ENDPOINT`` by the
real ``huggingface_hub`` client, written from huggingface_hub 2.4.0's jobs client:
``hf_api.py`` (``run_job`` → ``POST /api/jobs/{ns}`` with the body ``_jobs_api.py``'s
``_create_job_spec`` builds: ``command``, ``arguments``, ``environment``, ``secrets``,
``flavor``, ``timeoutSeconds``, ``labels``, ``dockerImage``; ``inspect_job`` → ``GET
/api/jobs/{ns}/{id}``; ``cancel_job`` → ``POST /api/jobs/{ns}/{id}/cancel``; ``list_jobs`` →
``GET /api/jobs/{ns}`` with repeated ``stage`` and ``label=k=v``, paged by ``Link:
rel="next"`` as ``utils/_pagination.py`` follows it; ``fetch_job_logs`` → the server-sent
``GET /api/jobs/{ns}/{id}/logs`` (``data: {"timestamp", "data"}`` events replayed from the
start or the last ``tail``, ``: keep-alive`` comments while quiet, the stream closed once the
job ended, as ``_stream_sse_events`` reads it), ``whoami`` → ``GET /api/whoami-v2``),
``_jobs_api.py``'s ``JobInfo`` (camelCase fields, ``status.stage`` one of ``JobStage``,
``durations``) and ``JobHardware`` (the flavors), and ``utils/_http.py``'s
``hf_raise_for_status`` (401 with ``X-Error-Message: Invalid credentials in Authorization
header``; a 404 on a job URL becomes ``JobNotFoundError``; ``{"error": ...}`` bodies).

The wording of refusals the client does not parse (an unknown flavor, an image that cannot
be pulled, a timeout) is the stand-in's own. A job ended at ``timeoutSeconds`` is reported
``ERROR`` with a message naming the timeout (JobStage has no stage of its own for it).

Its jobs really run: the command starts as a local process (the image is ignored; the
current venv's ``bin`` leads ``PATH``, so ``traind`` is the one under test) with the job's
environment and secrets, its stdout and stderr are the log, ``timeoutSeconds`` and a cancel
end it (SIGTERM to its group, SIGKILL after ``grace``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

TOKEN = "hf_fakeJobsTokenForTheStandIn012345"
NAMESPACE = "traind-tester"
OWNER = {"id": "5e9ecfc04957053f60648a3e", "name": NAMESPACE, "type": "user"}
FLAVORS = frozenset({
    "cpu-basic", "cpu-upgrade", "cpu-performance", "cpu-xl", "t4-small", "t4-medium", "l4x1",
    "l4x4", "l40sx1", "l40sx4", "l40sx8", "a10g-small", "a10g-large", "a10g-largex2",
    "a10g-largex4", "a100-large", "a100x4", "a100x8", "h200", "h200x2", "h200x4", "h200x8",
    "rtx-pro-6000", "rtx-pro-6000x2", "rtx-pro-6000x4", "rtx-pro-6000x8",
})
"""huggingface_hub 2.4.0's ``JobHardware`` values, "kept in sync with the Hub API"."""
LIVE = ("SCHEDULING", "RUNNING")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@dataclass
class Job:
    """One job: its spec as received, its stage and its log."""

    id: str
    spec: dict[str, Any]
    created: float = field(default_factory=time.time)
    created_at: str = field(default_factory=_now)
    stage: str = "SCHEDULING"
    message: str | None = None
    started: float | None = None
    finished: float | None = None
    log: list[dict[str, str]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    proc: asyncio.subprocess.Process | None = None
    ending: str | None = None
    """The stage a stop by the platform (cancel, timeout) ends the job in."""

    def note(self) -> None:
        """Wake every log stream."""
        self.changed.set()
        self.changed = asyncio.Event()

    def info(self) -> dict[str, Any]:
        now = time.time()
        ran = None if self.started is None else (self.finished or now) - self.started
        return {
            "id": self.id, "createdAt": self.created_at, "owner": OWNER,
            "dockerImage": self.spec.get("dockerImage"), "spaceId": self.spec.get("spaceId"),
            "command": self.spec["command"], "arguments": self.spec.get("arguments", []),
            "environment": self.spec.get("environment", {}),
            "secrets": {k: None for k in self.spec.get("secrets", {})},  # names only
            "flavor": self.spec["flavor"], "labels": self.spec.get("labels"),
            "status": {"stage": self.stage, "message": self.message},
            "durations": {"schedulingSecs": int((self.started or now) - self.created),
                          "runningSecs": None if ran is None else int(ran),
                          "totalSecs": int((self.finished or now) - self.created)},
            "initiator": {"type": "user", "id": OWNER["id"], "name": NAMESPACE},
        }


class FakeHFJobs:
    """The stand-in's state and switches: ``refuse_create`` (status, message) refuses the
    next creates; ``fail_next[kind]`` answers 503 to the next N requests of ``kind``
    ("create", "inspect", "list"); an image in ``missing_images`` cannot be pulled."""

    def __init__(self, *, page: int = 2, keep_alive: float = 0.5, grace: float = 10.0,
                 scheduling: float = 0.2) -> None:
        self.page = page
        self.keep_alive = keep_alive
        self.grace = grace
        self.scheduling = scheduling
        self.jobs: dict[str, Job] = {}
        self.refuse_create: tuple[int, str] | None = None
        self.fail_next: dict[str, int] = {}
        self.missing_images: set[str] = set()
        self.requests: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/whoami-v2", self._whoami)
        app.router.add_post("/api/jobs/{ns}", self._create)
        app.router.add_get("/api/jobs/{ns}", self._list)
        app.router.add_get("/api/jobs/{ns}/{id}", self._inspect)
        app.router.add_post("/api/jobs/{ns}/{id}/cancel", self._cancel)
        app.router.add_get("/api/jobs/{ns}/{id}/logs", self._logs)
        app.on_shutdown.append(lambda _: self.stop_all())
        return app

    def live(self) -> list[str]:
        """Jobs scheduling or running (what is billed)."""
        return [j.id for j in self.jobs.values() if j.stage in LIVE]

    async def end(self, job_id: str, stage: str, message: str) -> None:
        """End a running job as the platform does at a timeout or a preemption: inspect then
        reports ``stage`` and ``message``."""
        await self._stop(self.jobs[job_id], stage, message)

    async def stop_all(self) -> None:
        """End every job's process (cleanup)."""
        for job in self.jobs.values():
            await self._stop(job, "CANCELED", "stand-in stopped")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            message = "Invalid credentials in Authorization header"
            return _error(401, message, {"X-Error-Message": message})
        kind = {"POST": "create", "GET": "inspect"}.get(request.method, "")
        if request.method == "GET" and "id" not in request.match_info:
            kind = "list"
        if self.fail_next.get(kind, 0) > 0 and not request.path.endswith("/logs"):
            self.fail_next[kind] -= 1
            return _error(503, "Service Unavailable")
        result: web.StreamResponse = await handler(request)
        return result

    async def _whoami(self, request: web.Request) -> web.Response:
        return web.json_response({"type": "user", "id": OWNER["id"], "name": NAMESPACE})

    def _job(self, request: web.Request) -> Job:
        job = self.jobs.get(request.match_info["id"])
        if request.match_info["ns"] != NAMESPACE or job is None:
            raise web.HTTPNotFound(text=json.dumps({"error": "Job not found"}),
                                   content_type="application/json")
        return job

    async def _create(self, request: web.Request) -> web.Response:
        if request.match_info["ns"] != NAMESPACE:
            return _error(403, f"You don't have the rights to run jobs in "
                               f"{request.match_info['ns']}")
        spec = await request.json()
        if not isinstance(spec.get("command"), list) or not spec["command"]:
            return _error(400, "command must be a non-empty list of strings")
        if not (spec.get("dockerImage") or spec.get("spaceId")):
            return _error(400, "dockerImage or spaceId is required")
        if spec.get("flavor") not in FLAVORS:
            return _error(400, f"Invalid flavor '{spec.get('flavor')}': expected one of "
                               f"{', '.join(sorted(FLAVORS))}")
        if self.refuse_create is not None:
            return _error(*self.refuse_create)
        job = Job(secrets.token_hex(12), spec)
        self.jobs[job.id] = job
        self._spawn(self._run(job))
        return web.json_response(job.info())

    async def _list(self, request: web.Request) -> web.Response:
        stages = request.query.getall("stage", [])
        labels = [tuple(v.split("=", 1)) for v in request.query.getall("label", [])]
        jobs = [j.info() for j in self.jobs.values()
                if (not stages or j.stage in stages)
                and all((j.spec.get("labels") or {}).get(k) == v for k, v in labels)]
        start = int(request.query.get("page", "0"))
        headers = {}
        if start + self.page < len(jobs):
            query = [(k, v) for k, v in request.query.items() if k != "page"]
            query.append(("page", str(start + self.page)))
            url = request.url.with_query(query)
            headers["Link"] = f'<{url}>; rel="next"'
        return web.json_response(jobs[start:start + self.page], headers=headers)

    async def _inspect(self, request: web.Request) -> web.Response:
        return web.json_response(self._job(request).info())

    async def _cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job.stage in LIVE:
            self._spawn(self._stop(job, "CANCELED", "Job canceled by the user"))
        return web.json_response({})

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        job = self._job(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        tail = request.query.get("tail")
        sent = max(0, len(job.log) - int(tail)) if tail else 0
        while True:
            for event in job.log[sent:]:
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            sent = len(job.log)
            if job.stage not in LIVE:
                break
            changed = job.changed
            try:
                await asyncio.wait_for(changed.wait(), self.keep_alive)
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
        await resp.write_eof()
        return resp

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _say(self, job: Job, line: str) -> None:
        job.log.append({"timestamp": _now(), "data": line})
        job.note()

    async def _run(self, job: Job) -> None:
        await asyncio.sleep(self.scheduling)
        if job.stage != "SCHEDULING":
            return
        image = job.spec.get("dockerImage") or ""
        if image in self.missing_images:
            job.stage, job.finished = "ERROR", time.time()
            job.message = f"Failed to pull image {image}: manifest unknown"
            job.note()
            return
        venv_bin = str(Path(sys.executable).parent)
        own = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRAIND_"))}
        env = {**own, "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
               **job.spec.get("environment", {}), **job.spec.get("secrets", {})}
        job.proc = await asyncio.create_subprocess_exec(
            *job.spec["command"], *job.spec.get("arguments", []), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        job.stage, job.started = "RUNNING", time.time()
        self._say(job, f"===== Job started at {job.created_at} =====")
        timeout = job.spec.get("timeoutSeconds")
        if timeout:
            loop = asyncio.get_running_loop()
            loop.call_later(timeout, lambda: self._spawn(
                self._stop(job, "ERROR", f"Job timeout: it ran {timeout} seconds")))
        assert job.proc.stdout is not None
        async for raw in job.proc.stdout:
            self._say(job, raw.decode(errors="replace").rstrip("\n"))
        code = await job.proc.wait()
        job.finished = time.time()
        if job.ending is not None:
            job.stage = job.ending
        elif code == 0:
            job.stage = "COMPLETED"
        else:
            job.stage, job.message = "ERROR", f"Job failed with exit code: {code}"
        job.note()

    async def _stop(self, job: Job, stage: str, message: str) -> None:
        """End ``job`` in ``stage``: SIGTERM to its process group, SIGKILL after grace."""
        if job.stage not in LIVE or job.ending is not None:
            return
        job.ending, job.message = stage, message
        if job.proc is None:
            job.stage, job.finished = stage, time.time()
            job.note()
            return
        await end_container(job.proc, self.grace)
        # _run sets the stage once the output is drained


async def end_container(proc: asyncio.subprocess.Process, grace: float,
                        first: signal.Signals = signal.SIGTERM, group: bool = True) -> None:
    """``first`` (SIGTERM) to ``proc``'s process group (``group``, else to ``proc`` alone),
    then after ``grace`` SIGKILL to it and every process below it: the container goes, all of
    it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, first) if group else proc.send_signal(first)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace)
    for pid in [proc.pid, *_descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, whatever its session (a container's whole tree)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit():
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for kid in parents.get(todo.pop(), []):
            found.append(kid)
            todo.append(kid)
    return found

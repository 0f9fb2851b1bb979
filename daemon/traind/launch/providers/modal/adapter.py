"""The ``modal`` adapter: a launch is one Modal Sandbox running ``traind run``.

Through the official client's async interface (modal 1.6): the app looked up by name
(``App.lookup``, created if missing), the image from a registry (``Image.from_registry``), the
secrets as one ``Secret.from_dict``, the sandbox made with ``Sandbox.create`` carrying the
launch's tag, found again with ``Sandbox.from_id`` and listed with ``Sandbox.list(tags=...)``.
Its state is ``poll()``'s return code: none yet is RUNNING, 0 COMPLETED, Modal's timeout
code TIMEOUT, its terminated code CANCELLED, any other ERROR. Its log is its stdout. The
token is the client's own (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``) and never leaves it.
Every library failure is translated here; a sandbox whose creation failed half-way is
terminated by the client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import modal
import modal.exception as mx
import structlog

from traind.launch.base import Handle
from traind.launch.config import ModalSection
from traind.launch.errors import BackendAPIError, InstanceNotFoundError, LaunchError, ProvisionError
from traind.launch.jobs import LABEL, JobSpec, JobState, JobStatus

log = structlog.get_logger("traind.launch")
T = TypeVar("T")
BACKEND = "modal"
CODES = {0: JobState.COMPLETED, 124: JobState.TIMEOUT, 137: JobState.CANCELLED}
"""The return codes modal's client gives a sandbox that completed, that its timeout ended and
that was terminated (``_result_returncode`` in modal/sandbox/_common.py)."""
LOG_IDLE = 2.0
LOG_SPAN = 15.0
"""The log so far: stdout read until it stays quiet LOG_IDLE seconds, or for LOG_SPAN seconds
at most (a sandbox that prints without pause); Modal's stream has no end before the sandbox's."""
REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (mx.AuthError, "Modal refused the token: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET to a "
                   "valid token (modal token new)"),
    (mx.PermissionDeniedError, "the token may not do this in the workspace"),
    (mx.ResourceExhaustedError, "Modal refused it for a quota or a lack of capacity"),
    (mx.NotFoundError, "Modal does not know it"),
    (mx.InvalidError, "Modal refused it as asked"),
    (mx.RemoteError, "Modal could not build the image"),
)
"""What a refusal means, by the client's exception, said before Modal's own words."""


def translate(exc: Exception, what: str, refused: type[LaunchError]) -> LaunchError:
    """The LaunchError for a failed ``what``: ``refused`` for a refusal, else BackendAPIError
    (a server error or a dropped connection, which the client retried already)."""
    said = " ".join(str(exc).split()) or type(exc).__name__
    for kind, meaning in REFUSALS:
        if isinstance(exc, kind):
            return refused(f"{BACKEND} {what}: {meaning} ({said})")
    return BackendAPIError(f"{BACKEND} {what}: {said}")


async def called(call: Awaitable[T], what: str,
                 refused: type[LaunchError] = BackendAPIError) -> T:
    """``call`` awaited, a modal failure translated."""
    try:
        return await call
    except mx.Error as exc:
        raise translate(exc, what, refused) from exc


def state_of(code: int | None) -> JobState:
    """A sandbox's return code (None while it runs), normalised."""
    if code is None:
        return JobState.RUNNING
    return CODES.get(code, JobState.ERROR)


class ModalBackend:
    """Modal Sandboxes in one app of one environment."""

    name = BACKEND

    def __init__(self, config: ModalSection) -> None:
        self.config = config

    async def submit(self, spec: JobSpec) -> Handle:
        """``Sandbox.create`` in the launch's app, tagged with the launch's label."""
        what = f"create sandbox (image {spec.image}, gpu {spec.flavor or 'none'})"
        env = self.config.environment or None
        app = await self._app(what, ProvisionError)
        sandbox = await called(modal.Sandbox.create.aio(
            *spec.command, app=app, image=modal.Image.from_registry(spec.image),
            secrets=[modal.Secret.from_dict(dict(spec.secrets))], env=dict(spec.env),
            gpu=spec.flavor or None, timeout=int(spec.timeout) or None,
            tags={**spec.labels, LABEL: spec.label}, environment_name=env,
        ), what, ProvisionError)
        log.info("launch_job_submitted", backend=BACKEND, job=sandbox.object_id,
                 namespace=self.config.app, image=spec.image, flavor=spec.flavor,
                 timeout=spec.timeout)
        return Handle(BACKEND, sandbox.object_id, spec.label, gpu_name=spec.flavor,
                      created_at=time.time())

    async def _app(self, what: str, refused: type[LaunchError] = BackendAPIError) -> modal.App:
        return await called(modal.App.lookup.aio(
            self.config.app, create_if_missing=True,
            environment_name=self.config.environment or None), what, refused)

    async def _sandbox(self, handle: Handle) -> modal.Sandbox:
        return await called(modal.Sandbox.from_id.aio(handle.instance_id),
                            f"find sandbox {handle.instance_id}", InstanceNotFoundError)

    async def inspect(self, handle: Handle) -> JobStatus:
        """``poll()``: its return code, normalised; a sandbox Modal does not know is GONE."""
        try:
            sandbox = await self._sandbox(handle)
        except InstanceNotFoundError as exc:
            return JobStatus(JobState.GONE, str(exc))
        code = await called(sandbox.poll.aio(), f"poll sandbox {handle.instance_id}")
        state = state_of(code)
        message = "" if code is None else f"exit code {code}"
        return JobStatus(state, message, handle.gpu_name)

    async def logs(
        self, handle: Handle, follow: bool, tail: int | None = None
    ) -> AsyncIterator[str]:
        """The sandbox's stdout, line by line: what is there (read until it stays quiet for
        LOG_IDLE seconds, LOG_SPAN at most; the last ``tail``), then with ``follow`` every line
        until its end."""
        sandbox = await self._sandbox(handle)
        queue: asyncio.Queue[str | Exception | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for line in sandbox.stdout:
                    queue.put_nowait(str(line).rstrip("\n"))
            except mx.Error as exc:
                queue.put_nowait(translate(exc, f"logs of sandbox {handle.instance_id}",
                                           BackendAPIError))
            queue.put_nowait(None)

        async def taken(within: float | None) -> str | None:
            item = await asyncio.wait_for(queue.get(), within)
            if isinstance(item, Exception):
                raise item
            return item

        reader = asyncio.create_task(pump())
        try:
            there: list[str] = []
            ended = False
            until = time.monotonic() + LOG_SPAN
            while (left := until - time.monotonic()) > 0:
                try:
                    line = await taken(min(LOG_IDLE, left))
                except TimeoutError:
                    break
                if line is None:
                    ended = True
                    break
                there.append(line)
            for line in there[-tail:] if tail is not None else there:
                yield line
            while follow and not ended and (line := await taken(None)) is not None:
                yield line
        finally:
            reader.cancel()

    async def cancel(self, handle: Handle) -> None:
        """``terminate()``, unless the sandbox has ended already."""
        if (await self.inspect(handle)).state.ended:
            return
        sandbox = await self._sandbox(handle)
        await called(sandbox.terminate.aio(), f"terminate sandbox {handle.instance_id}")

    async def running(self, label: str) -> list[str]:
        """``Sandbox.list`` of the app and the launch's tag: Modal lists only sandboxes still
        running."""
        what = f"list sandboxes tagged {LABEL}={label}"
        app = await self._app(what)

        async def listed() -> list[str]:
            return [sb.object_id async for sb in
                    modal.Sandbox.list.aio(app_id=app.app_id, tags={LABEL: label})]

        return await called(listed(), what)

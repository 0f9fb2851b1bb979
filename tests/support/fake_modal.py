"""A stand-in for Modal's control plane: a grpclib server implementing, from the protocol
definitions the ``modal`` client ships (``modal_proto/api_pb2.py`` and ``api_grpc.py`` of
modal 1.6.4), only the ``modal.client.ModalClient`` calls the ``modal`` launch adapter makes,
as modal-client's own test servicer does (``MockClientServicer`` in its test/conftest.py, a
``ModalClientBase`` subclass served by grpclib on a local port the client reaches through
``MODAL_SERVER_URL``). Every other call answers UNIMPLEMENTED.

The calls, and the client code that makes them (modal 1.6.4): ``AppGetOrCreate``
(app.py, ``App.lookup``), ``ImageGetOrCreate`` and the streamed ``ImageJoinStreaming``
(_image.py, ``_Image._load``, ``_image_await_build_result``), ``SecretGetOrCreate``
(secret.py, ``Secret.from_dict``), ``EnvironmentGetOrCreate`` (_environments.py, for the
image builder version _image.py asks of the environment), ``SandboxCreate``,
``SandboxGetTaskId``, ``SandboxWait``,
``SandboxTerminate`` and the streamed ``SandboxGetLogs`` (io_streams.py,
``_sandbox_logs_iterator``) for a sandbox with a GPU, which is a V1 sandbox
(sandbox/_impl_v1.py; ``impl_class_for_create_args`` in sandbox/_sandbox.py); for one without,
a V2 sandbox as ``sandbox_v2`` defaults to on (config.py), ``SandboxCreateV2``,
``SandboxWaitV2``, ``SandboxGetTaskIdV2``, ``SandboxTerminateV2`` and
``SandboxGetCommandRouterAccess`` (sandbox/_impl_v2.py), its stdout read from the task's
command router (``TaskCommandRouter.SandboxStdioReadV2``, sandbox/_task_command_router_client.py,
served on a second port over plain HTTP/2 as the client allows for a localhost server);
``SandboxListV2`` of both (sandbox/_sandbox.py ``list``) with the token ``AuthTokenGet`` gives
(_utils/auth_token_manager.py; V2 calls carry it as ``x-modal-auth-token``); ``ClientHello``
(client.py).

Behaviour: every call needs the metadata ``x-modal-token-id``/``x-modal-token-secret`` of
the one valid token (client.py's ``_get_metadata``), else UNAUTHENTICATED, as Modal answers.
V1 sandbox ids have the V1 shape (``sb-`` and 22 letters or digits:
sandbox/_common.py), V2 ones another (``sb-`` and 26), V2 task ids end in ``V``
(``_is_v2_task_id``). A sandbox really runs its entrypoint as a local process with its
secrets' values (by id for V1, inline ``secret_sources`` for V2) in its environment; its stdout
is its log; it ends at ``timeout_secs`` (GENERIC_STATUS_TIMEOUT) or on SandboxTerminate
(GENERIC_STATUS_TERMINATED), its process group sent SIGTERM then, after ``grace``, SIGKILL.
``preempt`` ends one as Modal preempts a worker: SIGINT to the entrypoint, SIGKILL to all
after ``grace`` (as ``modal.exception.simulate_preemption`` describes it), reported
GENERIC_STATUS_INTERNAL_FAILURE ("lost inputs or worker preemption", _functions.py) with the
process's exit code; the client's returncode is that exit code (``_result_returncode``).
``SandboxList`` lists the sandboxes not finished, filtered by tags, paged by
``before_timestamp``. An image whose registry tag is in ``missing_images`` fails to build;
a GPU type not in GPUS is INVALID_ARGUMENT; ``refuse_create`` (status, message) refuses
SandboxCreate; ``fail_next[rpc]`` answers UNAVAILABLE to the next N calls of ``rpc``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import signal
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream
from modal_proto import api_grpc, api_pb2, task_command_router_grpc
from modal_proto import task_command_router_pb2 as tcr_pb2
from tests.support.fake_hf_jobs import end_container

TOKEN_ID = "ak-traindtestfake0000000000"
TOKEN_SECRET = "as-traindtestfake0000000000"
GPUS = frozenset({"T4", "L4", "A10G", "A100", "A100-40GB", "A100-80GB", "L40S", "H100", "H200",
                  "B200"})
BUILDER = "2026.10"
"""The image builder version the environment reports (LATEST_IMAGE_BUILDER_VERSION of 1.6.4)."""
IMPLEMENTED = ("ClientHello", "EnvironmentGetOrCreate", "AppGetOrCreate", "ImageGetOrCreate",
               "ImageJoinStreaming",
               "SecretGetOrCreate", "SandboxCreate", "SandboxGetTaskId", "SandboxWait",
               "SandboxTerminate", "SandboxListV2", "AuthTokenGet", "SandboxGetLogs",
               "SandboxCreateV2", "SandboxGetTaskIdV2", "SandboxWaitV2", "SandboxTerminateV2",
               "SandboxGetCommandRouterAccess", "SandboxStdioReadV2")
OK = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
PREEMPTED = api_pb2.GenericResult.GENERIC_STATUS_INTERNAL_FAILURE
V2_CALLS = frozenset(name for name in IMPLEMENTED if name.endswith("V2") or "CommandRouter" in name)
"""Calls the client makes with the ``x-modal-auth-token`` of AuthTokenGet."""


def _id(prefix: str, length: int = 22, suffix: str = "") -> str:
    alphabet = string.ascii_letters + string.digits
    return f"{prefix}-" + "".join(secrets.choice(alphabet) for _ in range(length)) + suffix


def _jwt(seconds: float) -> str:
    """A token the client can read the expiry of (its payload's ``exp``), valid ``seconds``."""
    claims = json.dumps({"exp": int(time.time() + seconds)}).encode()
    return f"e30.{base64.urlsafe_b64encode(claims).decode().rstrip('=')}.sig"


@dataclass
class Sandbox:
    """One sandbox: its definition, tags, process, log and result (None while it runs)."""

    id: str
    app_id: str
    definition: Any
    tags: dict[str, str]
    env: dict[str, str]
    v2: bool = False
    created_at: float = field(default_factory=time.time)
    task_id: str = ""
    proc: asyncio.subprocess.Process | None = None
    log: list[str] = field(default_factory=list)
    result: Any = None
    ending: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class FakeModal:
    """The stand-in's state and switches (see the module docstring)."""

    def __init__(self, *, grace: float = 10.0, scheduling: float = 0.2) -> None:
        self.grace = grace
        self.scheduling = scheduling
        self.apps: dict[str, str] = {}
        self.images: dict[str, str] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.sandboxes: dict[str, Sandbox] = {}
        self.missing_images: set[str] = set()
        self.refuse_create: tuple[Status, str] | None = None
        self.fail_next: dict[str, int] = {}
        self.calls: list[str] = []
        self.router_jwts: set[str] = set()
        self.router_url = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._servers: list[Server] = []

    async def _serve(self, handler: Any) -> str:
        server = Server([handler])
        await server.start("127.0.0.1", 0)
        self._servers.append(server)
        port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> str:
        """Serve the control plane and the command router on free ports of 127.0.0.1;
        return the MODAL_SERVER_URL."""
        self.router_url = await self._serve(_abstract_filled(
            _Router, task_command_router_grpc.TaskCommandRouterBase)(self))
        return await self._serve(_abstract_filled(_Calls, api_grpc.ModalClientBase)(self))

    async def stop(self) -> None:
        """End every sandbox's process, then the server."""
        for box in self.sandboxes.values():
            await self.end(box, api_pb2.GenericResult.GENERIC_STATUS_TERMINATED)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            server.close()
            await server.wait_closed()

    def live(self) -> list[str]:
        """Sandboxes not finished (what is billed)."""
        return [b.id for b in self.sandboxes.values() if b.result is None]

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def gate(self, stream: Stream[Any, Any], rpc: str) -> None:
        """The token check and the UNAVAILABLE switch of every call."""
        self.calls.append(rpc)
        meta = stream.metadata or {}
        if meta.get("x-modal-token-id") != TOKEN_ID or \
                meta.get("x-modal-token-secret") != TOKEN_SECRET:
            raise GRPCError(Status.UNAUTHENTICATED, "Token ID is malformed or invalid.")
        if rpc in V2_CALLS and not meta.get("x-modal-auth-token"):
            raise GRPCError(Status.UNAUTHENTICATED, "Missing auth token.")
        if self.fail_next.get(rpc, 0) > 0:
            self.fail_next[rpc] -= 1
            raise GRPCError(Status.UNAVAILABLE, "upstream connect error")

    async def run(self, box: Sandbox) -> None:
        """Schedule ``box``, run its entrypoint, record its result."""
        await asyncio.sleep(self.scheduling)
        if box.result is not None:
            return
        definition = box.definition
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "TRAIND_"))}
        env["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        env.update(box.env)
        box.proc = await asyncio.create_subprocess_exec(
            *definition.entrypoint_args, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
        )
        box.task_id = _id("ta", suffix="V" if box.v2 else "")
        box.note()
        if definition.timeout_secs:
            asyncio.get_running_loop().call_later(definition.timeout_secs, lambda: self.spawn(
                self.end(box, api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT)))
        assert box.proc.stdout is not None
        async for raw in box.proc.stdout:
            box.log.append(raw.decode(errors="replace"))
            box.note()
        code = await box.proc.wait()
        if box.ending is not None:
            box.result = api_pb2.GenericResult(status=box.ending, exitcode=code)
        else:
            status = OK if code == 0 else api_pb2.GenericResult.GENERIC_STATUS_FAILURE
            box.result = api_pb2.GenericResult(status=status, exitcode=code)
        box.note()

    async def end(self, box: Sandbox, status: int, first: signal.Signals = signal.SIGTERM,
                  group: bool = True) -> None:
        """End ``box`` with ``status``: ``first`` (SIGTERM) to its process group (``group``,
        else to its entrypoint alone), SIGKILL to all after grace."""
        if box.result is not None or box.ending is not None:
            return
        box.ending = status
        if box.proc is None:
            box.result = api_pb2.GenericResult(status=status)
            box.note()
            return
        await end_container(box.proc, self.grace, first, group)

    async def preempt(self, sandbox_id: str) -> None:
        """End a sandbox as Modal preempts its worker: SIGINT to its entrypoint, SIGKILL to
        all after ``grace``."""
        await self.end(self.sandboxes[sandbox_id], PREEMPTED, signal.SIGINT, group=False)

    async def time_out(self, sandbox_id: str) -> None:
        """End a sandbox as its ``timeout_secs`` does, now."""
        await self.end(self.sandboxes[sandbox_id], api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT)

    def stdout(self, box: Sandbox) -> bytes:
        """Everything ``box`` wrote to its stdout so far."""
        return "".join(box.log).encode()


def _abstract_filled(calls: type, base: type) -> Any:
    """The servicer class: ``base``'s IMPLEMENTED calls are ``calls``', the rest
    UNIMPLEMENTED."""

    def unimplemented(name: str) -> Any:
        async def call(self: Any, stream: Stream[Any, Any]) -> None:
            raise GRPCError(Status.UNIMPLEMENTED, f"{name} is not in the stand-in")
        return call

    others = {name: unimplemented(name) for name in base.__abstractmethods__
              if name not in IMPLEMENTED}
    return type(f"Fake{base.__name__}", (calls, base), others)


class _Calls:
    def __init__(self, fake: FakeModal) -> None:
        self.fake = fake

    async def _take(self, stream: Stream[Any, Any], rpc: str) -> Any:
        await self.fake.gate(stream, rpc)
        return await stream.recv_message()

    def _box(self, sandbox_id: str) -> Sandbox:
        box = self.fake.sandboxes.get(sandbox_id)
        if box is None:
            raise GRPCError(Status.NOT_FOUND, f"Sandbox {sandbox_id} not found")
        return box

    async def ClientHello(self, stream: Stream[Any, Any]) -> None:
        await self._take(stream, "ClientHello")
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def EnvironmentGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "EnvironmentGetOrCreate")
        metadata = api_pb2.EnvironmentMetadata(
            name=req.deployment_name or "main",
            settings=api_pb2.EnvironmentSettings(image_builder_version=BUILDER))
        await stream.send_message(api_pb2.EnvironmentGetOrCreateResponse(
            environment_id=_id("en"), metadata=metadata))

    async def AppGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "AppGetOrCreate")
        key = f"{req.environment_name}/{req.app_name}"
        app_id = self.fake.apps.setdefault(key, _id("ap"))
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=app_id))

    async def ImageGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "ImageGetOrCreate")
        image_id = _id("im")
        self.fake.images[image_id] = "\n".join(req.image.dockerfile_commands)
        await stream.send_message(api_pb2.ImageGetOrCreateResponse(image_id=image_id))

    async def ImageJoinStreaming(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "ImageJoinStreaming")
        dockerfile = self.fake.images.get(req.image_id, "")
        missing = [tag for tag in self.fake.missing_images if f"FROM {tag}" in dockerfile]
        if missing:
            result = api_pb2.GenericResult(
                status=api_pb2.GenericResult.GENERIC_STATUS_FAILURE,
                exception=f"failed to pull {missing[0]}: manifest unknown")
        else:
            result = api_pb2.GenericResult(status=OK)
        await stream.send_message(api_pb2.ImageJoinStreamingResponse(result=result))

    async def SecretGetOrCreate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SecretGetOrCreate")
        secret_id = _id("st")
        self.fake.secrets[secret_id] = dict(req.env_dict)
        await stream.send_message(api_pb2.SecretGetOrCreateResponse(secret_id=secret_id))

    def _created(self, req: Any, env: dict[str, str], v2: bool) -> Sandbox:
        """A sandbox of ``req`` (either version's create request), scheduled."""
        gpu = req.definition.resources.gpu_config
        if gpu.gpu_type and gpu.gpu_type not in GPUS:
            raise GRPCError(Status.INVALID_ARGUMENT, f"Unknown GPU type: {gpu.gpu_type}")
        if self.fake.refuse_create is not None:
            raise GRPCError(*self.fake.refuse_create)
        box = Sandbox(_id("sb", 26 if v2 else 22), req.app_id, req.definition,
                      {t.tag_name: t.tag_value for t in req.tags}, env, v2)
        self.fake.sandboxes[box.id] = box
        self.fake.spawn(self.fake.run(box))
        return box

    async def SandboxCreate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxCreate")
        env: dict[str, str] = {}
        for secret_id in req.definition.secret_ids:
            env.update(self.fake.secrets.get(secret_id, {}))
        box = self._created(req, env, v2=False)
        await stream.send_message(api_pb2.SandboxCreateResponse(sandbox_id=box.id))

    async def SandboxCreateV2(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxCreateV2")
        env = {}
        for source in req.secret_sources:
            env.update(self.fake.secrets.get(source.secret_id, {}) if source.secret_id
                       else dict(source.env.contents))
        box = self._created(req, env, v2=True)
        await stream.send_message(api_pb2.SandboxCreateV2Response(sandbox_id=box.id))

    async def _task_id(self, stream: Stream[Any, Any], rpc: str) -> None:
        req = await self._take(stream, rpc)
        box = self._box(req.sandbox_id)
        resp = api_pb2.SandboxGetTaskIdResponse(task_id=box.task_id)
        if box.result is not None:
            resp = api_pb2.SandboxGetTaskIdResponse(task_result=box.result)
        await stream.send_message(resp)

    async def _wait(self, stream: Stream[Any, Any], rpc: str) -> None:
        req = await self._take(stream, rpc)
        box = self._box(req.sandbox_id)
        deadline = time.monotonic() + req.timeout
        while box.result is None and (left := deadline - time.monotonic()) > 0:
            changed = box.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
        resp = api_pb2.SandboxWaitResponse()
        if box.result is not None:
            resp = api_pb2.SandboxWaitResponse(result=box.result)
        await stream.send_message(resp)

    async def _terminate(self, stream: Stream[Any, Any], rpc: str) -> None:
        req = await self._take(stream, rpc)
        box = self._box(req.sandbox_id)
        self.fake.spawn(self.fake.end(box, api_pb2.GenericResult.GENERIC_STATUS_TERMINATED))
        await stream.send_message(api_pb2.SandboxTerminateResponse())

    async def SandboxGetCommandRouterAccess(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxGetCommandRouterAccess")
        box = self._box(req.sandbox_id)
        if box.result is not None:
            raise GRPCError(Status.FAILED_PRECONDITION, f"Sandbox {box.id} has finished")
        jwt = _jwt(3600)
        self.fake.router_jwts.add(jwt)
        await stream.send_message(api_pb2.SandboxGetCommandRouterAccessResponse(
            jwt=jwt, url=self.fake.router_url))

    async def AuthTokenGet(self, stream: Stream[Any, Any]) -> None:
        await self._take(stream, "AuthTokenGet")
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=_jwt(3600)))

    async def SandboxListV2(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxListV2")
        wanted = {t.tag_name: t.tag_value for t in req.tags}
        boxes = [b for b in self.fake.sandboxes.values()
                 if (req.include_finished or b.result is None)
                 and (not req.app_id or b.app_id == req.app_id)
                 and (not req.before_timestamp or b.created_at < req.before_timestamp)
                 and all(b.tags.get(k) == v for k, v in wanted.items())]
        boxes.sort(key=lambda b: b.created_at, reverse=True)
        infos = [api_pb2.SandboxInfo(id=b.id, created_at=b.created_at) for b in boxes[:2]]
        await stream.send_message(api_pb2.SandboxListResponse(sandboxes=infos))

    async def SandboxGetLogs(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxGetLogs")
        box = self._box(req.sandbox_id)
        sent = int(req.last_entry_id or 0)
        if req.file_descriptor != api_pb2.FILE_DESCRIPTOR_STDOUT:
            sent = len(box.log)  # stderr: the stand-in sends it nowhere
        deadline = time.monotonic() + (req.timeout or 55)
        while True:
            changed = box.changed
            if sent < len(box.log):
                items = [api_pb2.TaskLogs(data=line, file_descriptor=req.file_descriptor)
                         for line in box.log[sent:]]
                sent = len(box.log)
                await stream.send_message(api_pb2.TaskLogsBatch(items=items, entry_id=str(sent)))
            if box.result is not None:
                await stream.send_message(api_pb2.TaskLogsBatch(eof=True, entry_id=str(sent)))
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)


def _answered_by(impl: str, rpc: str) -> Any:
    """The handler of ``rpc``: ``_Calls.<impl>`` (a V1 call and its V2 twin alike)."""

    async def call(self: _Calls, stream: Stream[Any, Any]) -> None:
        await getattr(self, impl)(stream, rpc)

    return call


for _rpc, _impl in (("SandboxGetTaskId", "_task_id"), ("SandboxWait", "_wait"),
                    ("SandboxTerminate", "_terminate")):
    setattr(_Calls, _rpc, _answered_by(_impl, _rpc))
    setattr(_Calls, f"{_rpc}V2", _answered_by(_impl, f"{_rpc}V2"))


class _Router:
    """The task command router of every V2 sandbox's worker: only its stdio read."""

    def __init__(self, fake: FakeModal) -> None:
        self.fake = fake

    async def SandboxStdioReadV2(self, stream: Stream[Any, Any]) -> None:
        """The sandbox's stdout from the byte ``offset`` on, until it has ended (its stderr
        goes nowhere in the stand-in: nothing)."""
        self.fake.calls.append("SandboxStdioReadV2")
        said = (stream.metadata or {}).get("authorization", "")
        if said.removeprefix("Bearer ") not in self.fake.router_jwts:
            raise GRPCError(Status.UNAUTHENTICATED, "invalid or expired JWT")
        req = await stream.recv_message()
        box = next((b for b in self.fake.sandboxes.values() if b.task_id == req.task_id), None)
        if box is None:
            raise GRPCError(Status.NOT_FOUND, f"Task {req.task_id} not found")
        sent = req.offset
        while True:
            changed = box.changed
            out = self.fake.stdout(box)
            if req.file_descriptor == tcr_pb2.SANDBOX_STDIO_FILE_DESCRIPTOR_STDOUT and \
                    sent < len(out):
                await stream.send_message(tcr_pb2.SandboxStdioReadV2Response(
                    data=out[sent:], starting_offset=sent))
                sent = len(out)
            if box.result is not None:
                return
            await changed.wait()

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
``SandboxTerminate`` (sandbox/_impl_v1.py: a sandbox with a GPU is a V1 sandbox),
``SandboxListV2`` with the token ``AuthTokenGet`` gives (sandbox/_sandbox.py ``list``, which
lists V1 and V2 sandboxes through sandbox/_impl_v2.py as ``sandbox_v2`` defaults to on;
_utils/auth_token_manager.py), the streamed ``SandboxGetLogs`` (io_streams.py,
``_sandbox_logs_iterator``) and ``ClientHello`` (client.py).

Behaviour: every call needs the metadata ``x-modal-token-id``/``x-modal-token-secret`` of
the one valid token (client.py's ``_get_metadata``), else UNAUTHENTICATED, as Modal answers.
Sandbox ids have the V1 shape (``sb-`` and 22 letters or digits: sandbox/_common.py). A
sandbox really runs its entrypoint as a local process with the secret's values in its
environment; its stdout is its log; it ends at ``timeout_secs`` (GENERIC_STATUS_TIMEOUT)
or on SandboxTerminate (GENERIC_STATUS_TERMINATED), its process group sent SIGTERM then, after
``grace``, SIGKILL. ``SandboxList`` lists the sandboxes not finished, filtered by tags, paged
by ``before_timestamp``. An image whose registry tag is in ``missing_images`` fails to build;
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
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream
from modal_proto import api_grpc, api_pb2
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
               "SandboxTerminate", "SandboxListV2", "AuthTokenGet", "SandboxGetLogs")
OK = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS


def _id(prefix: str) -> str:
    alphabet = string.ascii_letters + string.digits
    return f"{prefix}-" + "".join(secrets.choice(alphabet) for _ in range(22))


@dataclass
class Sandbox:
    """One sandbox: its definition, tags, process, log and result (None while it runs)."""

    id: str
    app_id: str
    definition: Any
    tags: dict[str, str]
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
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: Server | None = None

    async def start(self) -> str:
        """Serve on a free port of 127.0.0.1; return the MODAL_SERVER_URL."""
        self._server = Server([_servicer(self)])
        await self._server.start("127.0.0.1", 0)
        port = self._server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        """End every sandbox's process, then the server."""
        for box in self.sandboxes.values():
            await self.end(box, api_pb2.GenericResult.GENERIC_STATUS_TERMINATED)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

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
        for secret_id in definition.secret_ids:
            env.update(self.secrets.get(secret_id, {}))
        box.proc = await asyncio.create_subprocess_exec(
            *definition.entrypoint_args, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
        )
        box.task_id = _id("ta")
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

    async def end(self, box: Sandbox, status: int) -> None:
        """End ``box`` with ``status``: SIGTERM to its process group, SIGKILL after grace."""
        if box.result is not None or box.ending is not None:
            return
        box.ending = status
        if box.proc is None:
            box.result = api_pb2.GenericResult(status=status)
            box.note()
            return
        await end_container(box.proc, self.grace)


def _servicer(fake: FakeModal) -> api_grpc.ModalClientBase:
    """A ModalClientBase whose IMPLEMENTED calls are _Calls' and the rest UNIMPLEMENTED."""

    def unimplemented(name: str) -> Any:
        async def call(self: Any, stream: Stream[Any, Any]) -> None:
            raise GRPCError(Status.UNIMPLEMENTED, f"{name} is not in the stand-in")
        return call

    others = {name: unimplemented(name) for name in api_grpc.ModalClientBase.__abstractmethods__
              if name not in IMPLEMENTED}
    cls = type("FakeModalServicer", (_Calls, api_grpc.ModalClientBase), others)
    servicer: api_grpc.ModalClientBase = cls(fake)
    return servicer


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

    async def SandboxCreate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxCreate")
        gpu = req.definition.resources.gpu_config
        if gpu.gpu_type and gpu.gpu_type not in GPUS:
            raise GRPCError(Status.INVALID_ARGUMENT, f"Unknown GPU type: {gpu.gpu_type}")
        if self.fake.refuse_create is not None:
            raise GRPCError(*self.fake.refuse_create)
        box = Sandbox(_id("sb"), req.app_id, req.definition,
                      {t.tag_name: t.tag_value for t in req.tags})
        self.fake.sandboxes[box.id] = box
        self.fake.spawn(self.fake.run(box))
        await stream.send_message(api_pb2.SandboxCreateResponse(sandbox_id=box.id))

    async def SandboxGetTaskId(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxGetTaskId")
        box = self._box(req.sandbox_id)
        resp = api_pb2.SandboxGetTaskIdResponse(task_id=box.task_id)
        if box.result is not None:
            resp = api_pb2.SandboxGetTaskIdResponse(task_result=box.result)
        await stream.send_message(resp)

    async def SandboxWait(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxWait")
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

    async def SandboxTerminate(self, stream: Stream[Any, Any]) -> None:
        req = await self._take(stream, "SandboxTerminate")
        box = self._box(req.sandbox_id)
        self.fake.spawn(self.fake.end(box, api_pb2.GenericResult.GENERIC_STATUS_TERMINATED))
        await stream.send_message(api_pb2.SandboxTerminateResponse())

    async def AuthTokenGet(self, stream: Stream[Any, Any]) -> None:
        await self._take(stream, "AuthTokenGet")
        claims = json.dumps({"exp": int(time.time()) + 3600}).encode()
        token = f"e30.{base64.urlsafe_b64encode(claims).decode().rstrip('=')}.sig"
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=token))

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

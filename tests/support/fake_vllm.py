"""A stand-in for vLLM's OpenAI-compatible server (``vllm serve``), plus the helpers tests use.

Written from vLLM's source as TRL 1.16 runs it (TRL supports vLLM 0.22-0.31; ``trl vllm-serve``
execs ``python -m vllm.entrypoints.cli.main serve MODEL --host H --port P ...
--weight-transfer-config '{"backend": "nccl"}'`` with ``VLLM_SERVER_DEV_MODE=1``). What it
follows, per file of vLLM main (frontend layout; ``vllm/entrypoints/serve/...`` are shims):

- ``vllm/utils/network_utils.py`` ``create_server_socket``: the port is bound with SO_REUSEADDR
  and SO_REUSEPORT before the engine loads, and listened on only when serving starts, so a
  loading server refuses connections; the engine core child inherits the bound socket (fork).
- ``frontend/entrypoints/serve/instrumentator/health.py``: ``GET /health`` is 200, or 503 once
  the engine is dead (``EngineDeadError``); no body.
- ``frontend/entrypoints/serve/dev/rlhf/api_router.py`` and ``dev/cache``, ``server_info``:
  the weight-transfer routes (``/init_weight_transfer_engine``, ``/start_weight_update``,
  ``/update_weights``, ``/finish_weight_update``, ``/get_world_size``, ``/pause``, ...),
  ``/reset_prefix_cache`` and ``/server_info`` exist only with ``VLLM_SERVER_DEV_MODE=1``.
- FastAPI/Starlette routing: a path that matches a route once its trailing slash is toggled
  gets a 307 to that URL (``redirect_slashes``); a known path with another method gets 405.
- ``/metrics``: vLLM's Prometheus names (``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:generation_tokens_total``, ...).
- The engine core runs in a child named ``VLLM::EngineCore`` (prctl; vLLM uses setproctitle)
  that outlives a SIGKILLed API server (vllm#55510); the API server exits 0 after its engine
  died; an engine stuck in its busy loop leaves ``/health`` at 200 while no token is generated
  (vllm#39863).
- ``frontend/entrypoints/launchers/launcher.py``: ``watchdog_loop`` ends the HTTP server within
  5 s of the engine's death, and the process exits 0 (vllm#48966), unless
  ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``, which keeps it answering 503. (vLLM 0.31's
  ``vllm/utils/network_utils.py`` binds with SO_REUSEPORT always; later versions only with
  several API servers.)

Run as ``python fake_vllm.py serve MODEL --host H --port P [vLLM flags]``; vLLM flags it does
not model are accepted and ignored. Test knobs are ``--fake-*`` flags, times counted from the
moment it serves:

- ``--fake-load S``: bound, not listening, for S seconds (the model loads);
- ``--fake-warmup S``: 503 while listening (for versions or proxies that do that; vLLM's
  health router itself has no warm-up state);
- ``--fake-engine-dies-after S``, ``--fake-stall-after S`` (the engine stops stepping),
  ``--fake-requests N`` (requests kept in flight);
- ``--fake-crash-after S`` (the API server exits 1), ``--fake-unresponsive-after S`` (it stops
  answering), ``--fake-ignore-sigterm``, ``--fake-grandchild PIDFILE`` (a setsid grandchild);
- ``--fake-pid-file FILE`` (``api PID`` and ``engine PID`` lines), ``--fake-request-log FILE``
  (one ``METHOD PATH`` line per dev-mode call);
- ``--fake-old-trl``: the older ``trl vllm-serve`` server's routes instead (see OLD_TRL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
ENGINE_NAME = "VLLM::EngineCore"
STEP = 0.02
"""Seconds per engine step: every running request gets one token per step."""
WATCHDOG = 5.0
"""vLLM's ``VLLM_WATCHDOG_TIME_S``: how often the API server checks for a dead engine."""
PR_SET_NAME = 15

GRANDCHILD = """
import os, sys, time
os.setsid()
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\\n")
print("grandchild escaped", flush=True)
time.sleep(3600)
"""

PUBLIC = {
    "/health": ("GET",), "/ping": ("GET", "POST"), "/version": ("GET",),
    "/v1/models": ("GET",), "/metrics": ("GET",), "/load": ("GET",),
    "/v1/completions": ("POST",), "/v1/chat/completions": ("POST",),
    "/tokenize": ("POST",), "/detokenize": ("POST",),
}
SCALE_OUT = {"/v1/chat/completions/render": ("POST",), "/inference/v1/generate": ("POST",)}
"""Registered with ``--enable-scale-out`` (vLLM 0.30+; ``trl vllm-serve`` passes it there)."""
DEV = {
    "/server_info": ("GET",), "/reset_prefix_cache": ("POST",), "/reset_mm_cache": ("POST",),
    "/sleep": ("POST",), "/wake_up": ("POST",), "/is_sleeping": ("GET",),
    "/collective_rpc": ("POST",), "/pause": ("POST",), "/resume": ("POST",),
    "/is_paused": ("GET",), "/abort_requests": ("POST",),
    "/init_weight_transfer_engine": ("POST",), "/start_weight_update": ("POST",),
    "/update_weights": ("POST",), "/finish_weight_update": ("POST",),
    "/update_weight_version": ("POST",), "/weight_info": ("GET",), "/get_world_size": ("GET",),
}


OLD_TRL = {
    "/health/": ("GET",), "/get_world_size/": ("GET",), "/generate/": ("POST",),
    "/init_communicator/": ("POST",), "/update_named_param/": ("POST",),
    "/reset_prefix_cache/": ("POST",), "/close_communicator/": ("POST",),
}
"""``--fake-old-trl``: the FastAPI server older TRL releases ran as ``trl vllm-serve``
(``trl/scripts/vllm_serve.py`` before it execs vLLM's): trailing-slash routes, no
``/v1/models`` or ``/metrics``, and ``/close_communicator/`` to drop the weight-sync group."""


def set_process_name(name: str) -> None:
    """Name this process as ``ps``/``pgrep`` show it (``comm``, 15 bytes), as setproctitle does."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


# --- the engine core process ---------------------------------------------------------------


def engine_main(a: argparse.Namespace) -> None:
    """The engine core: load, say ready, then one step message per STEP until told to stop
    (or, stalled, never again); it keeps running when the API server is gone."""
    set_process_name(ENGINE_NAME)
    link = socket.socket(fileno=a.engine_fd)
    time.sleep(a.fake_load)
    link.sendall(b"ready\n")
    started = time.monotonic()
    while True:
        now = time.monotonic() - started
        if a.fake_engine_dies_after is not None and now >= a.fake_engine_dies_after:
            print("EngineCore died: RuntimeError('CUDA error: an illegal memory access')",
                  flush=True)
            os._exit(1)
        if a.fake_stall_after is None or now < a.fake_stall_after:
            # a gone API server goes unnoticed: the engine lives on (vllm#55510)
            with contextlib.suppress(OSError):
                link.sendall(b"step\n")
        time.sleep(STEP)


# --- the API server ------------------------------------------------------------------------


class Engine:
    """The API server's view of its engine: alive, the requests in flight, tokens so far."""

    def __init__(self, model: str, requests: int) -> None:
        self.model = model
        self.dead = False
        self.running: dict[int, int] = {i: 10**9 for i in range(requests)}
        self.finished: dict[int, asyncio.Future[None]] = {}
        self.generated = 0
        self.prompt_tokens = 0
        self.successes = 0
        self.next_id = requests

    def step(self) -> None:
        """One engine step: every running request gets a token; finished ones complete."""
        for rid in list(self.running):
            self.running[rid] -= 1
            self.generated += 1
            if self.running[rid] <= 0:
                del self.running[rid]
                self.successes += 1
                fut = self.finished.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)

    async def generate(self, tokens: int) -> None:
        """Queue a request of ``tokens`` tokens and wait until the engine generated them."""
        rid, self.next_id = self.next_id, self.next_id + 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.finished[rid] = fut
        self.running[rid] = tokens
        self.prompt_tokens += 4
        await fut

    def metrics(self) -> str:
        """The Prometheus text vLLM's ``/metrics`` serves, for the series traind reads."""
        labels = f'engine="0",model_name="{self.model}"'
        rows = [
            ("vllm:num_requests_running", "gauge",
             "Number of requests in model execution batches.", len(self.running)),
            ("vllm:num_requests_waiting", "gauge",
             "Number of requests waiting to be processed.", 0),
            ("vllm:kv_cache_usage_perc", "gauge",
             "KV-cache usage. 1 means 100 percent usage.", 0.01 * len(self.running)),
            ("vllm:prompt_tokens_total", "counter",
             "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter",
             "Number of generation tokens processed.", self.generated),
        ]
        out: list[str] = []
        for name, kind, text, value in rows:
            base = name.removesuffix("_total")
            out += [f"# HELP {base} {text}", f"# TYPE {base} {kind}",
                    f"{name}{{{labels}}} {float(value)}"]
        out += ["# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success counter",
                f'vllm:request_success_total{{{labels},finished_reason="length"}} '
                f"{float(self.successes)}"]
        return "\n".join(out) + "\n"


class ApiServer:
    """The HTTP side: routes as vLLM's FastAPI app has them, answers from the engine state."""

    def __init__(self, a: argparse.Namespace, engine: Engine) -> None:
        self.a = a
        self.engine = engine
        self.dev = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        scale_out = SCALE_OUT if a.enable_scale_out else {}
        self.routes = OLD_TRL if a.fake_old_trl else PUBLIC | scale_out | (DEV if self.dev else {})
        self.logged = set(OLD_TRL if a.fake_old_trl else DEV)
        self.serving_at = 0.0
        self.weight_transfer = json.loads(a.weight_transfer_config or "null")

    def since_serving(self) -> float:
        return time.monotonic() - self.serving_at

    def past(self, after: float | None) -> bool:
        return after is not None and self.since_serving() >= after

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        if self.past(self.a.fake_unresponsive_after):
            await asyncio.sleep(3600)
        path, method = request.path, request.method
        allowed = self.routes.get(path)
        if allowed is None:
            other = path[:-1] if path.endswith("/") else path + "/"
            if path != "/" and other in self.routes:
                target = request.url.with_path(other)
                return web.Response(status=307, headers={"location": str(target)})
            return _error(404, "Not Found", "NotFoundError")
        if method not in allowed:
            return _error(405, "Method Not Allowed", "MethodNotAllowed")
        if path in self.logged and self.a.fake_request_log:
            _append(self.a.fake_request_log, f"{method} {path}\n")
        return await self.answer(path, request)

    async def answer(self, path: str, request: Any) -> Any:
        from aiohttp import web

        e = self.engine
        if path == "/health/":  # the old TRL server: 200 while its process answers
            return web.json_response({"status": "ok"})
        if path == "/get_world_size/":
            return web.json_response({"world_size": 1})
        if path == "/health":
            warming = self.since_serving() < self.a.fake_warmup
            return web.Response(status=503 if e.dead or warming else 200)
        if path == "/metrics":
            return web.Response(text=e.metrics(), content_type="text/plain")
        if path == "/v1/models":
            card = {"id": e.model, "object": "model", "owned_by": "vllm", "root": e.model}
            return web.json_response({"object": "list", "data": [card]})
        if path == "/version":
            return web.json_response({"version": "0.31.0"})
        if path == "/server_info":
            config = {"weight_transfer_config": self.weight_transfer,
                      "model_config": {"model": e.model}}
            return web.json_response({"vllm_config": config})
        if path == "/get_world_size":
            return web.json_response({"world_size": 1})
        if path in ("/v1/completions", "/v1/chat/completions"):
            if e.dead:
                return _error(500, "EngineCore encountered an issue.", "EngineDeadError")
            body = await request.json()
            tokens = int(body.get("max_tokens") or 16)
            prompts = body.get("prompt", [""])
            prompts = prompts if isinstance(prompts, list) else [prompts]
            n = int(body.get("n") or 1)
            await asyncio.gather(*(e.generate(tokens) for _ in range(len(prompts) * n)))
            choices = [_choice(i, prompt, tokens, body.get("logprobs"))
                       for i, prompt in enumerate(p for p in prompts for _ in range(n))]
            return web.json_response({"object": "text_completion", "model": e.model,
                                      "choices": choices})
        return web.json_response({"status": "ok"})


def _choice(index: int, prompt: Any, tokens: int, logprobs: int | None) -> dict[str, Any]:
    """One completion choice as vLLM returns it with ``return_token_ids``: token 7 repeated."""
    ids = prompt if isinstance(prompt, list) else [1] * max(1, len(str(prompt)) // 4)
    choice: dict[str, Any] = {"index": index, "text": " x" * tokens, "finish_reason": "length",
                              "prompt_token_ids": ids, "token_ids": [7] * tokens,
                              "logprobs": None}
    if logprobs is not None:
        choice["logprobs"] = {"tokens": ["token_id:7"] * tokens,
                              "token_logprobs": [-0.5] * tokens,
                              "top_logprobs": [{"token_id:7": -0.5}] * tokens}
    return choice


def _error(status: int, message: str, kind: str) -> Any:
    from aiohttp import web

    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def server_socket(host: str, port: int) -> socket.socket:
    """Bind as vLLM does: SO_REUSEADDR and SO_REUSEPORT, before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def start_engine(sock: socket.socket | None) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """Start the engine core child; like vLLM's forked child it holds the bound socket too."""
    ours, theirs = socket.socketpair()
    argv = [sys.executable, str(SCRIPT), *sys.argv[1:], "--engine-fd", str(theirs.fileno())]
    held = (theirs.fileno(),) if sock is None else (theirs.fileno(), sock.fileno())
    child = subprocess.Popen(argv, pass_fds=held)
    theirs.close()
    return ours, child


async def serve(a: argparse.Namespace, sock: socket.socket | None, ours: socket.socket,
                child: subprocess.Popen[bytes]) -> int:
    """Listen once the engine loaded (the old TRL server only binds then), serve until SIGTERM
    or the engine's death; the exit code."""
    from aiohttp import web

    loop = asyncio.get_running_loop()
    reader, _ = await asyncio.open_connection(sock=ours)
    if await reader.readline() != b"ready\n":
        print("ERROR Engine core initialization failed.", flush=True)
        return 1
    sock = sock or server_socket(a.host, a.port)
    engine = Engine(a.model, a.fake_requests)
    api = ApiServer(a, engine)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    if not a.fake_ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
    sock.listen(128)
    await web.SockSite(runner, sock).start()
    api.serving_at = time.monotonic()
    print(f"INFO Starting vLLM server on http://{a.host}:{a.port}", flush=True)
    if a.fake_crash_after is not None:
        loop.call_later(a.fake_crash_after, os._exit, 1)
    code = await _until_done(api, reader, engine, stop)
    if not engine.dead:
        child.terminate()
    await runner.cleanup()
    return code


async def _until_done(api: ApiServer, reader: asyncio.StreamReader, engine: Engine,
                      stop: asyncio.Event) -> int:
    async def steps() -> None:
        while await reader.readline():
            engine.step()
        engine.dead = True
        print("ERROR AsyncLLM output_handler failed. EngineDeadError", flush=True)
        if os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") in ("", "0"):
            # launcher.watchdog_loop: every WATCHDOG seconds, an errored engine ends the
            # server, and the process exits 0 (vllm#48966)
            await asyncio.sleep(WATCHDOG - api.since_serving() % WATCHDOG)
            print("INFO [shutdown] API server: shutting down FastAPI HTTP server", flush=True)
            os._exit(0)
        await asyncio.Event().wait()

    task = asyncio.create_task(steps())
    await stop.wait()
    task.cancel()
    return 0


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(text)


def parser() -> argparse.ArgumentParser:
    """``vllm serve``'s arguments that matter here, the rest ignored, and the test knobs."""
    p = argparse.ArgumentParser(prog="vllm", description="vLLM stand-in")
    p.add_argument("subcommand", choices=["serve"])
    p.add_argument("model", nargs="?", default="Qwen/Qwen2.5-0.5B")
    p.add_argument("--model", dest="model_flag")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--weight-transfer-config")
    p.add_argument("--enable-scale-out", action="store_true")
    p.add_argument("--fake-load", type=float, default=0.0)
    p.add_argument("--fake-warmup", type=float, default=0.0)
    p.add_argument("--fake-engine-dies-after", type=float)
    p.add_argument("--fake-crash-after", type=float)
    p.add_argument("--fake-unresponsive-after", type=float)
    p.add_argument("--fake-stall-after", type=float)
    p.add_argument("--fake-requests", type=int, default=0)
    p.add_argument("--fake-ignore-sigterm", action="store_true")
    p.add_argument("--fake-old-trl", action="store_true")
    p.add_argument("--fake-grandchild", metavar="PIDFILE")
    p.add_argument("--fake-pid-file", metavar="FILE")
    p.add_argument("--fake-request-log", metavar="FILE")
    p.add_argument("--engine-fd", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    a, _ignored = parser().parse_known_args(argv)
    a.model = a.model_flag or a.model
    if a.engine_fd is not None:
        engine_main(a)
        return
    if a.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.fake_grandchild:
        subprocess.Popen([sys.executable, "-c", GRANDCHILD, a.fake_grandchild])
    sock = None if a.fake_old_trl else server_socket(a.host, a.port)
    print(f"INFO vLLM API server version 0.31.0; model {a.model}", flush=True)
    ours, child = start_engine(sock)
    _append(a.fake_pid_file, f"api {os.getpid()}\nengine {child.pid}\n")
    sys.exit(asyncio.run(serve(a, sock, ours, child)))


# --- helpers for tests -------------------------------------------------------------------


def command(port: int, *flags: str, model: str = "Qwen/Qwen2.5-0.5B") -> tuple[str, ...]:
    """The argv that runs this stand-in as ``vllm serve MODEL --host 127.0.0.1 --port P``."""
    return (sys.executable, str(SCRIPT), "serve", model, "--host", "127.0.0.1",
            "--port", str(port), *flags)


SHIM_MAIN = """
import runpy, sys
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def install_as_vllm(root: Path) -> dict[str, str]:
    """Make the stand-in launchable the ways vLLM is: a ``vllm`` executable (``vllm serve``)
    and a ``vllm`` package whose ``python -m vllm.entrypoints.cli.main`` runs it, with
    version 0.31.0 metadata (what ``trl vllm-serve`` checks and execs). Returns the PATH and
    PYTHONPATH that find them."""
    bin_dir, lib = root / "bin", root / "lib"
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "vllm"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPT}" "$@"\n')
    exe.chmod(0o755)
    cli = lib / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True, exist_ok=True)
    for package in (lib / "vllm", lib / "vllm" / "entrypoints", cli):
        (package / "__init__.py").write_text("")
    (lib / "vllm" / "__init__.py").write_text('__version__ = "0.31.0"\n')
    (cli / "main.py").write_text(SHIM_MAIN.format(script=str(SCRIPT)))
    info = lib / "vllm-0.31.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    (info / "top_level.txt").write_text("vllm\n")
    path = os.environ.get("PATH", "")
    python_path = os.environ.get("PYTHONPATH", "")
    return {"PATH": f"{bin_dir}:{path}",
            "PYTHONPATH": f"{lib}:{python_path}" if python_path else str(lib)}


def engine_pids(path: Path) -> list[int]:
    """Engine core pids from a ``--fake-pid-file``, oldest first."""
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return []
    return [int(x.split()[1]) for x in lines if x.startswith("engine ")]


def named_engines(path: Path) -> list[int]:
    """Engine core pids from a ``--fake-pid-file`` that already carry ``VLLM::EngineCore``."""
    found = []
    for pid in engine_pids(path):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == ENGINE_NAME[:15]:
            found.append(pid)
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def pids_in(path: Path) -> list[int]:
    """Pids written one per line into ``path`` (empty when it does not exist)."""
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


async def until(condition: Callable[[], bool], interval: float = 0.05) -> None:
    """Poll ``condition`` until it is true (callers bound it with a timeout)."""
    while True:
        if condition():
            return
        await asyncio.sleep(interval)


async def wait_gone(pids: Iterable[int], within: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` has a /proc entry (zombies count as present); return the
    survivors."""
    deadline = time.monotonic() + within
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if Path(f"/proc/{p}").exists()]
        await asyncio.sleep(0.02)
    return left


if __name__ == "__main__":
    main()

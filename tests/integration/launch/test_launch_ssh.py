"""``traind launch`` end to end on this machine: over a real loopback sshd (the ``ssh``
adapter) and directly (the ``local`` adapter). A real tiny TRL run trains under the launched
traind, its checkpoints are committed to a store on the "remote", and ``down`` brings the
newest one home and lets the host go."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.requires import missing, need_binary, need_module
from tests.support.sshd import SSHServer, keygen
from tests.support.tiny_train import QUIET_ENV, train_command

from traind.launch import flow, manage
from traind.launch.config import load
from traind.launch.errors import HostUnreachableError
from traind.launch.handles import LaunchStore
from traind.launch.registry import open_backend

pytestmark = pytest.mark.timeout(240)


class Launcher:
    """``python -m traind launch ...`` in its own process group; output collected."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "traind", "launch", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def wait_out(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The first stdout line matching ``predicate``, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in list(self.out) if predicate(line)), None)
            if found is not None:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no such line; stderr tail:\n{self.tail()}")

    def wait(self, timeout: float) -> int:
        """The exit status, waiting up to ``timeout`` seconds."""
        code = self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=5)
        return code

    def events(self) -> list[dict[str, object]]:
        """The launcher's own structured log events (stderr, JSON)."""
        found = []
        for line in self.err:
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
        return found

    def tail(self) -> str:
        return "\n".join([*self.err[-25:], "--- stdout ---", *self.out[-25:]])

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def committed(line: str, step: int | None = None) -> bool:
    """Whether ``line`` is traind's checkpoint_committed event (for ``step``)."""
    try:
        event = json.loads(line)
    except ValueError:
        return False
    return event.get("event") == "checkpoint_committed" and step in (None, event.get("step"))


def kill_traind(remote: Path) -> None:
    """Kill the launched traind and its trainer if they still run (cleanup after a failure)."""
    for pidfile in (remote / "launches").glob("*/traind.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
    for pid in trainer_pids(remote / "out"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def trainer_pids(output_dir: Path) -> list[int]:
    """Processes whose command line names ``output_dir`` (the tiny trainer's)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(output_dir) in (proc / "cmdline").read_text():
                found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def project(tmp_path: Path, *, max_steps: int, backend_toml: str, extra: str = "") -> Path:
    """A run's code, its traind config (trainer = the tiny TRL script) and a launch.toml."""
    remote = tmp_path / "remote"
    code = tmp_path / "project" / "code"
    (code / ".git").mkdir(parents=True)
    (code / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (code / "README").write_text("the run's code\n")
    trainer = train_command(remote / "out", max_steps=max_steps, save_steps=1, step_sleep=1.0)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    (tmp_path / "project" / "traind.toml").write_text(f"""
[run]
name = "tiny"
output_dir = "{remote / "out"}"
state_dir = "{remote / "state"}"
stop_timeout = "10s"

[checkpoints]
settle = "1s"
poll_interval = "200ms"

[storage]
type = "local"
path = "{remote / "store"}"

[status]
enabled = false

[trainer]
command = {json.dumps(trainer)}
env = {{ {env} }}
first_progress_timeout = "120s"
""")
    launch = tmp_path / "project" / "launch.toml"
    launch.write_text(f"""
name = "tiny"
{backend_toml}

[run]
code_dir = "code"
traind_config = "traind.toml"
remote_dir = "{remote / "launches"}"

[constraints]
num_gpus = 0

[install]
python = "{sys.executable}"
venv = false
service = "nohup"
step_timeout = "90s"
stop_timeout = "20s"

[pull]
dir = "{tmp_path / "pulled"}"
{extra}
""")
    return launch


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    """A real sshd on a free loopback port (stopped with all its sessions afterwards)."""
    server = SSHServer(need_binary("sshd"), tmp_path / "sshd")
    server.start_sync()
    try:
        yield server
    finally:
        server.stop_sync()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where launches are saved, for this test and the launcher it starts."""
    monkeypatch.setenv("TRAIND_LAUNCH_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def ssh_backend(sshd: SSHServer, known_hosts: Path | None = None) -> str:
    return f"""backend = "ssh"

[host]
ssh_key = "{sshd.user_key.path}"
wait_running = "20s"

[[ssh.hosts]]
name = "loopback"
host = "127.0.0.1"
port = {sshd.port}
user = "{sshd.user}"
known_hosts = "{known_hosts or sshd.known_hosts}"
"""


def test_ssh_launch_train_detach_then_down(tmp_path: Path, sshd: SSHServer, state: Path) -> None:
    """launch over ssh starts traind on the host, which trains and commits; Ctrl-C detaches
    without stopping the run; status sees the commits; down pulls the newest committed
    checkpoint, stops traind with its trainer and releases the host."""
    need_binary("rsync")
    need_module("trl")
    launch_toml = project(tmp_path, max_steps=8, backend_toml=ssh_backend(sshd))
    store_dir = tmp_path / "remote/store/tiny"
    launcher = Launcher("-c", str(launch_toml), env={**os.environ})
    try:
        launcher.wait_out(lambda line: committed(line), timeout=150)
        record = LaunchStore().load("tiny")
        pid = int(Path(record.remote_root, "traind.pid").read_text())
        launcher.proc.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=30) == 0, launcher.tail()
        steps = [e["step"] for e in launcher.events() if e.get("event") == "launch_step"]
        assert steps == ["search", "provision", "wait_running", "connect", "prepare",
                         "sync_code", "sync_traind", "install", "start"]
        assert any(e.get("event") == "launch_detached" for e in launcher.events())
        deadline = time.monotonic() + 60
        while not (store_dir / "checkpoint-2/traind-manifest.json").exists():
            assert time.monotonic() < deadline, "the detached run did not go on"
            time.sleep(0.2)
        assert alive(pid), "Ctrl-C must detach, not stop the run"
        code = Path(record.remote_root, "code")
        assert (code / "README").read_text() == "the run's code\n"
        assert not (code / ".git").exists()

        async def status_then_down() -> tuple[dict[str, object], Path | None]:
            cfg = load(launch_toml)
            store = LaunchStore()
            ctx = flow.Context(cfg, open_backend(cfg, store), store)
            async with asyncio.timeout(120):
                facts = await manage.status(ctx, record)
                return facts, await manage.down(ctx, record)

        facts, pulled = asyncio.run(status_then_down())
        assert (facts["state"], facts["traind"]) == ("running", "running")
        last = facts["last_commit"]
        assert isinstance(last, dict), last
        assert last["tag"] == f"checkpoint-{last['step']}"
        assert pulled is not None
        assert pulled.parent == tmp_path / "pulled/tiny"
        assert (store_dir / pulled.name / "traind-manifest.json").exists()
        step = json.loads((pulled / "trainer_state.json").read_text())["global_step"]
        assert step >= 2
        assert pulled.name == f"checkpoint-{step}"
        assert not alive(pid)
        assert not trainer_pids(tmp_path / "remote/out"), "the trainer went down with traind"
        assert LaunchStore().names() == []
        assert LaunchStore().claims() == {}
    finally:
        launcher.kill()
        kill_traind(tmp_path / "remote")


def test_ssh_unknown_host_key_fails_and_releases(
    tmp_path: Path, sshd: SSHServer, state: Path
) -> None:
    """A host whose key known_hosts does not vouch for is refused; the failed launch releases
    its claim and is forgotten."""
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(sshd.known_hosts_line(keygen(tmp_path / "impostor").public) + "\n")
    launch_toml = project(tmp_path, max_steps=1, backend_toml=ssh_backend(sshd, wrong))
    launch_toml.write_text(launch_toml.read_text().replace('wait_running = "20s"',
                                                           'wait_running = "1s"'))
    cfg = load(launch_toml)
    store = LaunchStore()
    ctx = flow.Context(cfg, open_backend(cfg, store), store)

    async def attempt() -> None:
        async with asyncio.timeout(60):
            await flow.launch(ctx, launch_toml)

    with pytest.raises(HostUnreachableError, match="host key"):
        asyncio.run(attempt())
    assert store.names() == []
    assert store.claims() == {}


def test_local_launch_follows_to_the_end_then_downs(tmp_path: Path, state: Path) -> None:
    """With the local adapter and on_finish = "down", launch follows the run until it is
    complete, then pulls the newest checkpoint and releases the machine by itself."""
    need_binary("rsync")
    need_module("trl")
    launch_toml = project(tmp_path, max_steps=2, backend_toml='backend = "local"',
                          extra='\n[host]\non_finish = "down"\n')
    launcher = Launcher("-c", str(launch_toml), env={**os.environ})
    try:
        assert launcher.wait(timeout=200) == 0, launcher.tail()
        assert any(committed(line, 2) for line in launcher.out)
        assert any(json.loads(line).get("event") == "run_complete"
                   for line in launcher.out if line.startswith("{"))
        assert "tiny: finished" in launcher.err
        pulled = tmp_path / "pulled/tiny/checkpoint-2"
        assert json.loads((pulled / "trainer_state.json").read_text())["global_step"] == 2
        assert LaunchStore().names() == []
        assert LaunchStore().claims() == {}
    finally:
        launcher.kill()
        kill_traind(tmp_path / "remote")


@pytest.mark.timeout(660)
def test_local_launch_installs_traind_into_a_fresh_venv(tmp_path: Path, state: Path) -> None:
    """With venv = true (the example's setting) and a host Python that has none of traind's
    dependencies, launch creates the venv, installs traind's requirements (read from its
    package metadata) into it, and traind runs from there until down."""
    need_binary("rsync")
    host_python = "/usr/bin/python3"  # stock Debian's: no pydantic, aiohttp, prometheus-client
    probe = "import ensurepip, venv, sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)"
    if subprocess.run([host_python, "-c", probe], capture_output=True, timeout=30,
                      check=False).returncode:
        missing(f"{host_python} (3.11+, with venv and ensurepip: Debian python3-venv)")
    bare = subprocess.run([host_python, "-c", "import prometheus_client"], capture_output=True,
                          timeout=30, check=False)
    assert bare.returncode != 0, f"{host_python} has traind's dependencies: proves nothing"
    launch_toml = project(tmp_path, max_steps=1, backend_toml='backend = "local"')
    launch_toml.write_text(
        launch_toml.read_text()
        .replace(f'python = "{sys.executable}"\nvenv = false', f'python = "{host_python}"')
        .replace('step_timeout = "90s"', 'step_timeout = "400s"')
    )
    cfg = load(launch_toml)
    store = LaunchStore()
    ctx = flow.Context(cfg, open_backend(cfg, store), store)

    async def up_then_down() -> tuple[str, bool]:
        async with asyncio.timeout(600):
            record = await flow.launch(ctx, launch_toml)
            running = await flow.service_active(ctx, record)
            await manage.down(ctx, record, pull_first=False)
            return record.python, running

    try:
        python, running = asyncio.run(up_then_down())
        assert running
        assert python.endswith("/launches/tiny/venv/bin/python")
        assert store.names() == []
    finally:
        kill_traind(tmp_path / "remote")

"""``traind launch`` end to end on this machine: over a real loopback sshd (the ``ssh``
adapter) and directly (the ``local`` adapter). A real tiny TRL run trains under the launched
traind, its checkpoints are committed to a store on the "remote", and ``down`` brings the
newest one home and lets the host go."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.launch.lifecycle import (
    Launcher,
    alive,
    committed,
    kill_traind,
    project,
    trainer_pids,
)
from tests.support.requires import missing, need_binary, need_module
from tests.support.sshd import SSHServer, keygen

from traind.launch.base import SSHEndpoint
from traind.launch.commands import flow, manage
from traind.launch.config import load
from traind.launch.errors import HostUnreachableError, RemoteCommandError
from traind.launch.handles import LaunchStore
from traind.launch.host.remote import SSHRemote
from traind.launch.registry import open_backend

pytestmark = pytest.mark.timeout(240)


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


def test_a_command_timing_out_does_not_show_its_environment(sshd: SSHServer) -> None:
    """A remote command past its time limit is named without the exports before it: the
    launch's [run] env (HF_TOKEN, WANDB_API_KEY) stays out of the error."""
    remote = SSHRemote(SSHEndpoint("127.0.0.1", sshd.port, sshd.user,
                                   str(sshd.user_key.path), str(sshd.known_hosts)))
    with pytest.raises(RemoteCommandError) as info:
        asyncio.run(remote.run(["sleep", "30"], env={"HF_TOKEN": "hf_launch_secret"}, within=2))
    assert "'sleep 30' did not finish within 2" in str(info.value)
    assert "hf_launch_secret" not in str(info.value)


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

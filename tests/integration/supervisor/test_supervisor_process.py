"""ManagedProcess: environment, output draining and logs, stopping the whole tree."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import command, pids_in, wait_gone
from tests.support.net import free_port

from traind.config import ChildConfig, TrainerConfig
from traind.errors import SupervisorError
from traind.supervisor.env import CHILD_TAG, child_env
from traind.supervisor.policy import Role
from traind.supervisor.ports import port_use
from traind.supervisor.process import ManagedProcess, State
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.resources import wait_gpus_idle, wait_port_free

BASE_ENV = {
    "PATH": "/usr/bin:/bin",
    "NOTIFY_SOCKET": "/run/systemd/notify",
    "WATCHDOG_USEC": "30000000",
    "WATCHDOG_PID": "1",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "x",
    "TRAIND_RESUME_FROM": "/stale",
    "HF_HOME": "/cache",
}
DIST = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}


@pytest.fixture(scope="module", autouse=True)
def _subreaper() -> None:
    become_subreaper()


def cfg(*argv: str, **kw: object) -> ChildConfig:
    return ChildConfig.model_validate({"command": argv, **kw})


def test_child_env_for_vllm_drops_systemd_and_distributed() -> None:
    """vLLM and services lose NOTIFY_SOCKET, WATCHDOG_* and torch.distributed variables."""
    config = cfg("x", gpus=[1, 3], env={"HF_HOME": "/mine", "EXTRA": "1"})
    for role in (Role.VLLM, Role.SERVICE):
        env = child_env(BASE_ENV, config, role)
        systemd = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "TRAIND_RESUME_FROM"}
        assert not systemd & set(env)
        assert not DIST & set(env)
        assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["HF_HOME"] == "/mine"
        assert env["EXTRA"] == "1"
        assert env["PATH"] == "/usr/bin:/bin"
        assert env["PYTHONUNBUFFERED"] == "1"


def test_child_env_for_trainer_keeps_distributed() -> None:
    """The trainer keeps inherited torch.distributed variables but never systemd's."""
    env = child_env(BASE_ENV, cfg("x"), Role.TRAINER)
    assert set(env) >= DIST
    assert "NOTIFY_SOCKET" not in env
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_child_env_single_node_distributed() -> None:
    """distributed = true gives the trainer a rank-0-of-1 environment; config env wins."""
    config = TrainerConfig(command=("x",), distributed=True, env={"MASTER_PORT": "29555"})
    env = child_env({"PATH": "/bin"}, config, Role.TRAINER)
    assert env["RANK"] == env["LOCAL_RANK"] == "0"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["MASTER_PORT"] == "29555"


def test_child_env_empty_gpus_hides_all() -> None:
    """gpus = [] hides every GPU; gpus unset leaves CUDA_VISIBLE_DEVICES as inherited."""
    assert child_env({}, cfg("x", gpus=[]), Role.VLLM)["CUDA_VISIBLE_DEVICES"] == ""
    inherited = child_env({"CUDA_VISIBLE_DEVICES": "2"}, cfg("x"), Role.VLLM)
    assert inherited["CUDA_VISIBLE_DEVICES"] == "2"


def test_child_env_drops_traind_configuration() -> None:
    """traind's own configuration variables (secrets among them) never reach a child;
    other TRAIND_* names and a child's configured env do."""
    own = {"TRAIND_STORAGE__SECRET_ACCESS_KEY": "s3cret", "traind_storage__password": "pw",
           "TRAIND_STORAGE": '{"type": "s3"}', "TRAIND_RUN__NAME": "r",
           "TRAIND_ANYTHING__ELSE": "x"}
    kept = {"TRAIND_CONFIG": "/etc/traind/traind.toml", "TRAIND_PROJECT_TAG": "exp-7",
            "PATH": "/bin"}
    for role in Role:
        env = child_env({**own, **kept}, cfg("x", env={"TRAIND_RUN__NAME": "mine"}), role)
        assert not own.keys() - {"TRAIND_RUN__NAME"} & env.keys()
        assert env["TRAIND_RUN__NAME"] == "mine"
        assert kept.items() <= env.items()


async def test_spawned_child_gets_filtered_env(tmp_path: Path) -> None:
    """A real vLLM-role child sees the filtered environment plus its tracking tag."""
    lines: list[str] = []
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    p = ManagedProcess("envcheck", cfg(sys.executable, "-c", code, gpus=[0]), Role.VLLM,
                       log_dir=tmp_path, base_env=BASE_ENV,
                       on_line=lambda stream, line: lines.append(line))
    async with asyncio.timeout(10):
        await p.start()
        assert await p.wait() == 0
        await p.stop()
    env = json.loads(lines[0])
    assert not DIST & set(env)
    assert "NOTIFY_SOCKET" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env[CHILD_TAG].startswith("envcheck-")


async def test_output_is_drained_logged_and_rotated(tmp_path: Path) -> None:
    """Every line on stdout and stderr becomes a child_output event and lands in rotated files."""
    code = (
        "import sys\n"
        "for i in range(300):\n"
        "    print(f'out {i:04d} ' + 'x' * 90)\n"
        "    print(f'err {i:04d}', file=sys.stderr)\n"
        "sys.stdout.write('no newline at the end')\n"
    )
    config = cfg(sys.executable, "-c", code, log_max_bytes=4000, log_backups=2)
    p = ManagedProcess("chatty", config, Role.SERVICE, log_dir=tmp_path / "logs")
    with capture_logs() as logs:
        async with asyncio.timeout(10):
            pid = await p.start()
            assert await p.wait() == 0
            await p.stop()
    out = [e for e in logs if e["event"] == "child_output"]
    assert len(out) == 601
    assert {e["stream"] for e in out} == {"stdout", "stderr"}
    assert all(e["child"] == "chatty" and e["pid"] == pid for e in out)
    assert any(e["line"] == "no newline at the end" for e in out)
    files = sorted(f.name for f in (tmp_path / "logs").iterdir())
    assert files == ["chatty.log", "chatty.log.1", "chatty.log.2"]
    assert "no newline at the end" in (tmp_path / "logs" / "chatty.log").read_text()
    assert all(f.stat().st_size <= 4000 for f in (tmp_path / "logs").iterdir())


async def test_stop_kills_child_ignoring_sigterm_after_grace(tmp_path: Path) -> None:
    """A child that ignores SIGTERM is SIGKILLed once the grace period is over."""
    states: list[State] = []
    port = free_port()
    p = ManagedProcess("stubborn", cfg(*command(port, "--fake-ignore-sigterm"), stop_grace=0.4),
                       Role.VLLM, log_dir=tmp_path, on_state=lambda n, s: states.append(s))
    async with asyncio.timeout(15):
        pid = await p.start()
        await asyncio.sleep(0.3)  # let it install the SIGTERM handler
        started = time.monotonic()
        code = await p.stop()
        took = time.monotonic() - started
        assert await wait_gone([pid]) == []
    assert code == -9
    assert 0.4 <= took < 5
    assert states == [State.STARTING, State.STOPPING, State.EXITED]


async def test_stop_kills_grandchild_that_left_the_group(tmp_path: Path) -> None:
    """A grandchild that called setsid (left the group) is found and killed on stop."""
    pidfile = tmp_path / "grandchildren"
    p = ManagedProcess("forker", cfg(*command(free_port(), "--fake-grandchild", str(pidfile)),
                                     stop_grace=2), Role.VLLM, log_dir=tmp_path)
    async with asyncio.timeout(15):
        pid = await p.start()
        while True:
            if pids_in(pidfile):
                break
            await asyncio.sleep(0.02)
        (grandchild,) = pids_in(pidfile)
        await p.stop()
        assert await wait_gone([pid, grandchild]) == []
    assert p.returncode == -15


async def test_cancelled_stop_still_kills(tmp_path: Path) -> None:
    """Cancelling stop() during the grace period goes straight to SIGKILL and still waits."""
    argv = command(free_port(), "--fake-ignore-sigterm")
    p = ManagedProcess("cancelled", cfg(*argv, stop_grace=30), Role.VLLM, log_dir=tmp_path)
    async with asyncio.timeout(15):
        pid = await p.start()
        await asyncio.sleep(0.3)
        task = asyncio.create_task(p.stop())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert p.returncode == -9
        assert await wait_gone([pid], within=2) == []


async def test_spawn_failure_is_a_supervisor_error(tmp_path: Path) -> None:
    """A missing executable raises SupervisorError and leaves the child EXITED."""
    p = ManagedProcess("missing", cfg("/nonexistent/vllm", "serve"), Role.VLLM, log_dir=tmp_path)
    async with asyncio.timeout(5):
        with pytest.raises(SupervisorError, match="nonexistent"):
            await p.start()
        assert p.state is State.EXITED
        assert await p.stop() is None


async def test_port_wait(tmp_path: Path) -> None:
    """wait_port_free waits while something listens and returns once the port is free."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port_use(port).busy
        async with asyncio.timeout(5):
            assert (await wait_port_free(port, 0.3)).busy
    assert not port_use(port).busy
    async with asyncio.timeout(5):
        assert not (await wait_port_free(port, 0.3)).busy


async def test_gpu_wait_without_nvml_is_skipped() -> None:
    """Without NVML (or a baseline) the GPU wait returns at once."""
    async with asyncio.timeout(5):
        assert await wait_gpus_idle([0, 1], None, 10)
        assert await wait_gpus_idle([], {0: 0}, 10)

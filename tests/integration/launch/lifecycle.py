"""What the ``traind launch`` end-to-end tests share: the launcher run as a child process, a
project (code, a traind.toml training a tiny TRL run, a launch.toml) and the cleanup of what a
failed test left running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.tiny_train import QUIET_ENV, train_command

from traind.launch.config import LaunchConfig
from traind.layout.keys import MANIFEST_NAME
from traind.util.poll import poll_until


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


def committed(line: str, step: int = 0) -> bool:
    """Whether ``line`` is traind's checkpoint_committed event for ``step`` or a later one
    (a streamer behind a fast trainer commits the newest checkpoint only)."""
    try:
        event = json.loads(line)
    except ValueError:
        return False
    found = event.get("step") if event.get("event") == "checkpoint_committed" else None
    return isinstance(found, int) and found >= step


def kill_traind(remote: Path) -> None:
    """Kill the launched traind and its trainer if they still run (cleanup after a failure)."""
    for pidfile in (remote / "launches").glob("*/traind.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
    for pid in trainer_pids(remote / "out"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def trained_steps(state_dir: Path) -> list[int]:
    """The steps the tiny trainer printed into traind's trainer logs under ``state_dir``."""
    return [int(m.group(1)) for log in state_dir.rglob("*.log") if log.is_file()
            for m in re.finditer(r"\bstep=(\d+) loss=", log.read_text(errors="replace"))]


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


def job_config(tmp_path: Path, name: str, backend: str, table: dict[str, Any]) -> LaunchConfig:
    """A job launch ``name`` whose traind config is a real one (a local store, no trainer),
    its backend's table ``table``."""
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "traind.toml").write_text(
        f'[run]\nname = "x"\noutput_dir = "{tmp_path}/out"\nstate_dir = "{tmp_path}/st"\n'
        f'[storage]\ntype = "local"\npath = "{tmp_path}/store"\n[status]\nenabled = false\n')
    return LaunchConfig.model_validate({
        "name": name, "backend": backend,
        "run": {"code_dir": "code", "traind_config": "traind.toml"},
        "host": {"wait_running": "20s"}, backend.replace("-", "_"): table,
    }, context={"base": tmp_path})


async def status_pull_down(tmp_path: Path, env: dict[str, str],
                           name: str = "tiny") -> tuple[dict[str, Any], list[str]]:
    """The end of a job launch whose trainer committed step 2: ``launch status --json``
    says completed at that step, ``pull`` restores it under ``tmp_path/pulled``, ``down``
    (which pulls again, over the older copy) forgets the launch; each exits 0. Returns the
    status document and what pull and down wrote to stderr."""
    status = Launcher("status", name, "--json", env=env)
    assert await asyncio.to_thread(status.wait, 60) == 0, status.tail()
    facts: dict[str, Any] = json.loads("\n".join(status.out))
    assert (facts["state"], facts["last_commit"]["step"]) == ("completed", 2)
    pull = Launcher("pull", name, env=env)
    assert await asyncio.to_thread(pull.wait, 60) == 0, pull.tail()
    pulled = tmp_path / f"pulled/{name}/checkpoint-2"
    assert json.loads((pulled / "trainer_state.json").read_text())["global_step"] == 2
    down = Launcher("down", name, env=env)
    assert await asyncio.to_thread(down.wait, 60) == 0, down.tail()
    return facts, [*pull.err, *down.err]


@dataclass(frozen=True)
class Recovered:
    """One recovery of a run that outlived its job: how the job was ended; the newest
    checkpoint committed in the store when it ended, the one the next job resumed from (its
    trainer's first step less one) and the steps trained again; the launcher's own figures
    (its ``launch_recovered``: checkpoint and steps lost as the job's relayed log showed them,
    seconds from the end it saw to the next job running); seconds from the end to the next
    trainer's first step."""

    ended_by: str
    committed_at_end: int
    resumed_from: int
    trained_again: list[int]
    launcher_checkpoint: str
    launcher_steps_lost: str
    seconds_to_running: float
    seconds_to_training: float

    def row(self, backend: str) -> str:
        return (f"recovery: {backend} | {self.ended_by} | committed {self.committed_at_end}, "
                f"resumed from checkpoint-{self.resumed_from} (launcher: "
                f"{self.launcher_checkpoint}) | {len(self.trained_again)} "
                f"{self.trained_again} (launcher: {self.launcher_steps_lost}) | "
                f"{self.seconds_to_running:.1f} | {self.seconds_to_training:.1f}")


def resuming(tmp_path: Path) -> None:
    """Make the project's trainer resume from the checkpoint traind restored."""
    config = tmp_path / "project" / "traind.toml"
    config.write_text(config.read_text().replace('"--step-sleep"', '"--resume", "--step-sleep"'))


def newest_committed(remote: Path) -> int:
    """The newest checkpoint step committed in the project's local store (0: none)."""
    return max((int(m.parent.name.rpartition("-")[2])
                for m in (remote / "store").glob(f"*/checkpoint-*/{MANIFEST_NAME}")), default=0)


async def outlive(
    launcher: Launcher, remote: Path, endings: Sequence[tuple[str, Callable[[], Awaitable[None]]]],
    *, max_steps: int = 10, within: float = 300,
) -> list[Recovered]:
    """Follow a launch of a ``max_steps`` run (``project(..., max_steps)``, ``resuming``) whose
    job is ended mid-training once per ``endings`` (how, and a call that ends the running job
    and returns once its processes are gone), once checkpoint 3, 7, ... is committed (seen in
    the store, not in the launcher's relay of the job's log, which may lag); each ended job's
    disk is wiped as a new job's would be. Asserts that the launcher exits 0 after one
    recovery per ending, that every step is trained, that each next job resumes from a
    checkpoint no older than the newest committed when its predecessor ended, and that only
    steps after it are trained again, once at most. Returns the recoveries' figures."""
    trained: list[list[int]] = []
    at_end: list[int] = []
    to_training: list[float] = []

    async def stepped() -> list[int]:
        return trained_steps(remote / "state")

    for target, (_, end) in zip(range(3, 3 + 4 * len(endings), 4), endings, strict=True):

        async def reached(t: int = target) -> bool:
            return newest_committed(remote) >= t

        assert await poll_until(reached, within=within, every=0.2), launcher.tail()
        await end()
        ended = time.monotonic()
        at_end.append(newest_committed(remote))
        trained.append(trained_steps(remote / "state"))
        shutil.rmtree(remote / "out")
        shutil.rmtree(remote / "state")
        first = await poll_until(stepped, within=within, every=0.2,
                                 done=lambda s: bool(s) or launcher.proc.poll() is not None)
        assert first, f"the next job trained nothing:\n{launcher.tail()}"
        to_training.append(time.monotonic() - ended)
    assert await asyncio.to_thread(launcher.wait, within) == 0, launcher.tail()
    trained.append(trained_steps(remote / "state"))
    events = [e for e in launcher.events() if e.get("event") == "launch_recovered"]
    assert len(events) == len(endings), launcher.tail()
    everything = [step for job in trained for step in job]
    counts = {s: everything.count(s) for s in set(everything)}
    print(f"step trainings: {counts}")
    assert set(counts) == set(range(1, max_steps + 1)), counts
    assert all(n <= 2 for n in counts.values()), counts
    recovered = []
    for k, ((how, _), e) in enumerate(zip(endings, events, strict=True)):
        before, after = trained[k], trained[k + 1]
        resumed = min(after) - 1
        again = sorted(set(before) & set(after))
        assert resumed >= at_end[k], (how, at_end[k], before, after)
        assert all(s > resumed for s in again), (how, before, after)
        recovered.append(Recovered(how, at_end[k], resumed, again, str(e["checkpoint"]),
                                   str(e["steps_lost"]), float(str(e["seconds"])),
                                   to_training[k]))
    return recovered

"""The trainer: resume templating, vLLM reset before a restart, finishing, hang detection."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.support.fake_vllm import command, engine_pids, wait_gone
from tests.support.net import free_port

from traind.config import TrainerConfig, VLLMConfig
from traind.supervisor.process import State
from traind.supervisor.procfs import become_subreaper
from traind.supervisor.supervisor import Supervisor
from traind.supervisor.trainer import TrainerRunner, resume_argv

FAST = {"backoff_initial": 0.05, "backoff_max": 0.1, "max_restarts": 3, "window": 60,
        "stable_after": 60}

TRAINER = """
import json, os, sys, time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen
record, mode, *args = sys.argv[1:]
vllm = None
if "VLLM_HEALTH" in os.environ:
    try:
        vllm = urlopen(os.environ["VLLM_HEALTH"], timeout=2).status
    except (URLError, OSError) as exc:
        vllm = repr(exc)
with open(record, "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "args": args, "vllm": vllm,
                        "resume": os.environ.get("TRAIND_RESUME_FROM"),
                        "heartbeat": os.environ.get("TRAIND_HEARTBEAT")}) + "\\n")
runs = len(Path(record).read_text().splitlines())

def beat(phase):
    hb = Path(os.environ["TRAIND_HEARTBEAT"])
    tmp = hb.with_suffix(".tmp")
    tmp.write_text(json.dumps({"phase": phase}))
    os.replace(tmp, hb)

if mode == "crash-once":
    time.sleep(0.2)
    sys.exit(3 if runs == 1 else 0)
if mode == "print-then-stall":
    for i in range(5):
        print(f"step {i}")
        time.sleep(0.05)
elif mode.startswith("beat-then-stall"):
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        beat("training")
        time.sleep(0.05)
    beat(mode.split(":")[1])
time.sleep(3600)
"""


@pytest.fixture(scope="module", autouse=True)
def _subreaper() -> None:
    become_subreaper()


def trainer(tmp_path: Path, mode: str, *args: str, **kw: Any) -> TrainerConfig:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    argv = (sys.executable, str(script), str(tmp_path / "runs.jsonl"), mode, *args)
    return TrainerConfig.model_validate({"command": argv, "restart": FAST, "stop_grace": 1, **kw})


def runs(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]


def vllm(port: int, *flags: str, path: str = "/health", **kw: Any) -> VLLMConfig:
    return VLLMConfig.model_validate({
        "command": command(port, "--fake-load", "0.2", *flags),
        "health": {"url": f"http://127.0.0.1:{port}{path}", "interval": 0.05, "timeout": 0.5,
                   "successes": 1, "failures": 2, "ready_timeout": 5},
        "restart": FAST, "stop_grace": 1, "release_timeout": 2, **kw,
    })


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [
        (None, ["train.py", "--out=x"]),
        (Path("/ck/checkpoint-5"),
         ["train.py", "--resume_from_checkpoint", "/ck/checkpoint-5", "--out=x",
          "--resume=/ck/checkpoint-5", "trainer.resume=/ck/checkpoint-5", "/ck/checkpoint-5"]),
    ],
)
def test_resume_argv(checkpoint: Path | None, expected: list[str]) -> None:
    """Without a checkpoint a bare {resume_from} goes with its option, other uses alone."""
    command = ["train.py", "--resume_from_checkpoint", "{resume_from}", "--out=x",
               "--resume={resume_from}", "trainer.resume={resume_from}", "{resume_from}"]
    assert list(resume_argv(command, checkpoint)) == expected


def test_resume_argv_positional_after_program() -> None:
    """A bare {resume_from} right after a non-option is dropped alone."""
    assert resume_argv(["train.py", "{resume_from}", "--x"], None) == ("train.py", "--x")


@pytest.mark.parametrize("mode", [None, "restart"])
async def test_crash_resumes_after_vllm_reset(tmp_path: Path, mode: str | None) -> None:
    """A crashed trainer restarts from the newest checkpoint only once the vLLM server it
    shared a weight-transfer group with was restarted and is ready again (the default for
    vLLM's own server); its exit 0 then finishes the run and everything is stopped."""
    checkpoints = [None, tmp_path / "out" / "checkpoint-5"]
    calls: list[int] = []
    pids = tmp_path / "vllm.pids"

    async def resume_from() -> Path | None:
        calls.append(1)
        return checkpoints[min(len(calls), 2) - 1]

    port = free_port()
    extra = {} if mode is None else {"on_trainer_restart": mode}
    sup = Supervisor(
        state_dir=tmp_path / "state",
        vllm=vllm(port, "--fake-load", "0.5", "--fake-pid-file", str(pids), **extra),
        trainer=trainer(tmp_path, "crash-once", "--resume_from_checkpoint", "{resume_from}",
                        env={"VLLM_HEALTH": f"http://127.0.0.1:{port}/health"}),
        resume_from=resume_from,
    )
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            assert await sup.run() == "finished"
    assert sup.finished.is_set()
    first, second = runs(tmp_path)
    assert (first["args"], first["resume"], first["vllm"]) == ([], None, 200)
    assert second["args"] == ["--resume_from_checkpoint", str(checkpoints[1])]
    assert (second["resume"], second["vllm"]) == (str(checkpoints[1]), 200)
    assert second["heartbeat"] == str(tmp_path / "state" / "trainer.heartbeat")
    assert sup.vllm is not None
    assert sup.trainer is not None
    assert sup.vllm.starts == 2
    assert len(engine_pids(pids)) == 2
    if mode is None:
        reset = next(e for e in logs if e["event"] == "vllm_trainer_restart_reset")
        assert (reset["server"], reset["action"]) == ("vllm", "restart")
    assert sup.trainer.restarts == 1
    assert await wait_gone([first["pid"], second["pid"], *engine_pids(pids)]) == []


async def test_old_trl_server_gets_close_communicator(tmp_path: Path) -> None:
    """Against the older trl vllm-serve server (detected by its routes), the default resets
    the weight-sync group with POST /close_communicator/ instead of a restart."""
    calls = tmp_path / "calls"
    sup = Supervisor(
        state_dir=tmp_path / "state",
        vllm=vllm(free_port(), "--fake-old-trl", "--fake-request-log", str(calls),
                  path="/health/"),
        trainer=trainer(tmp_path, "crash-once"),
    )
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            assert await sup.run() == "finished"
    reset = next(e for e in logs if e["event"] == "vllm_trainer_restart_reset")
    assert (reset["server"], reset["action"]) == ("trl", "close-communicator")
    posts = [c for c in calls.read_text().splitlines() if c.startswith("POST")]
    assert posts == ["POST /close_communicator/"]
    assert sup.vllm is not None
    assert sup.vllm.starts == 1
    assert len(runs(tmp_path)) == 2


async def test_hang_without_heartbeat_uses_first_progress_timeout(tmp_path: Path) -> None:
    """A trainer that stops printing (no heartbeat yet) is hung after first_progress_timeout,
    then stopped and restarted."""
    config = trainer(tmp_path, "print-then-stall", progress_timeout=0.2,
                     first_progress_timeout=0.5, restart=FAST | {"max_restarts": 1})
    runner = TrainerRunner(config, log_dir=tmp_path, heartbeat=tmp_path / "hb",
                           ack_dir=tmp_path / "acks")
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            assert await runner.run() == "fatal"
    hung = [e for e in logs if e["event"] == "trainer_hung"]
    assert len(hung) == 2
    assert all(e["limit"] == 0.5 and e["loading"] for e in hung)
    assert [e["reason"] for e in logs if e["event"] == "child_backoff"] == ["hung"]
    assert await wait_gone([r["pid"] for r in runs(tmp_path)]) == []


@pytest.mark.parametrize(("phase", "limit"), [("training", 0.3), ("saving", 0.8)])
async def test_hang_after_heartbeat_stops(tmp_path: Path, phase: str, limit: float) -> None:
    """Heartbeats keep a silent trainer alive; once they stop it is hung after progress_timeout
    (first_progress_timeout while the last heartbeat said "saving")."""
    config = trainer(tmp_path, f"beat-then-stall:{phase}", progress_timeout=0.3,
                     first_progress_timeout=0.8, restart=FAST | {"policy": "never"})
    runner = TrainerRunner(config, log_dir=tmp_path, heartbeat=tmp_path / "state" / "hb",
                           ack_dir=tmp_path / "acks")
    started = time.monotonic()
    with capture_logs() as logs:
        async with asyncio.timeout(20):
            assert await runner.run() == "failed"
    assert time.monotonic() - started >= 1.0 + limit
    (hung,) = [e for e in logs if e["event"] == "trainer_hung"]
    assert (hung["limit"], hung["loading"]) == (limit, False)
    assert runner.state is State.EXITED


async def test_notify_progress_keeps_trainer_alive(tmp_path: Path) -> None:
    """notify_progress() (new checkpoints) counts as progress for a silent trainer."""
    config = trainer(tmp_path, "print-then-stall", progress_timeout=0.3,
                     first_progress_timeout=0.3)
    runner = TrainerRunner(config, log_dir=tmp_path, heartbeat=tmp_path / "hb",
                           ack_dir=tmp_path / "acks")
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(10):
            for _ in range(12):
                runner.notify_progress()
                await asyncio.sleep(0.1)
        assert runner.starts == 1
        assert runner.state is State.RUNNING
    finally:
        task.cancel()
        async with asyncio.timeout(10):
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_failing_resume_lookup_is_a_failed_start(tmp_path: Path) -> None:
    """An error from the daemon's resume_from counts as a failed start under the policy."""

    async def broken() -> Path | None:
        raise RuntimeError("store unreachable")

    config = trainer(tmp_path, "crash-once", restart=FAST | {"max_restarts": 1})
    runner = TrainerRunner(config, log_dir=tmp_path, heartbeat=tmp_path / "hb",
                           ack_dir=tmp_path / "acks", resume_from=broken)
    with capture_logs() as logs:
        async with asyncio.timeout(10):
            assert await runner.run() == "fatal"
    assert runner.starts == 0
    failed = [e for e in logs if e["event"] == "child_start_failed"]
    assert len(failed) == 2
    assert "store unreachable" in failed[0]["error"]


async def test_one_event_per_start_and_no_state_before_the_first(tmp_path: Path) -> None:
    """Each trainer start is one child_started carrying resume_from (no trainer_launch), its
    first child_state names no previous state, and a finished run logs no run_finished."""
    checkpoints = iter([None, tmp_path / "out" / "checkpoint-5"])

    async def resume_from() -> Path | None:
        return next(checkpoints)

    sup = Supervisor(state_dir=tmp_path / "state", trainer=trainer(tmp_path, "crash-once"),
                     resume_from=resume_from)
    with capture_logs() as logs:
        async with asyncio.timeout(30):
            assert await sup.run() == "finished"
    names = {e["event"] for e in logs}
    assert not names & {"trainer_launch", "run_finished"}
    started = [e for e in logs if e["event"] == "child_started"]
    assert [e["resume_from"] for e in started] == [None, str(tmp_path / "out" / "checkpoint-5")]
    states = [e for e in logs if e["event"] == "child_state"]
    assert "previous" not in states[0]
    assert states[0]["state"] == "STARTING"
    assert all("previous" in e for e in states[1:])

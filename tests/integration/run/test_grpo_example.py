"""config/grpo.toml as shipped, with only paths, ports and commands changed: its `vllm serve`
command left as it is and served by the vLLM stand-in (a `vllm` executable on PATH), a real
tiny TRL run as the trainer, S3 storage on SeaweedFS. A trainer crash restarts vLLM first and
resumes once it is ready again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.support.fake_vllm import command as fake_command
from tests.support.fake_vllm import install_as_vllm
from tests.support.net import free_ports
from tests.support.requires import need_binary, need_module
from tests.support.seaweed import ACCESS_KEY, SECRET_KEY, running_seaweed
from tests.support.tiny_train import QUIET_ENV, train_command

EXAMPLE = Path(__file__).parents[3] / "config" / "grpo.toml"


def sub(pattern: str, replacement: str, text: str) -> str:
    """``re.sub`` that must match exactly once (the example changed otherwise)."""
    new, count = re.subn(pattern, lambda _: replacement, text, flags=re.MULTILINE)
    assert count == 1, f"{pattern!r} matched {count} times in {EXAMPLE}"
    return new


def example(tmp_path: Path, ports: list[int], trainer: list[str]) -> str:
    """grpo.toml with its paths, ports and the service and trainer commands pointed at this
    test's; [vllm] keeps its command, only its port changes."""
    status, service, vllm = ports
    text = EXAMPLE.read_text()
    text = sub(r'^output_dir = "/data/grpo-qwen/out"', f'output_dir = "{tmp_path}/out"', text)
    text = sub(r'^state_dir = "/var/lib/traind"', f'state_dir = "{tmp_path}/state"', text)
    text = sub(r'^listen = "127.0.0.1:9750"', f'listen = "127.0.0.1:{status}"', text)
    text = sub(r'^command = \["python", "-m", "envserver", "--port", "9000"\]',
               f"command = {json.dumps(list(fake_command(service)))}", text)
    text = sub(r"127\.0\.0\.1:9000/health", f"127.0.0.1:{service}/health", text)
    text = sub(r'"--port", "8001",', f'"--port", "{vllm}",', text)
    text = sub(r"127\.0\.0\.1:8001/health", f"127.0.0.1:{vllm}/health", text)
    text = sub(r'^command = \["accelerate", .*\]$', f"command = {json.dumps(trainer)}", text)
    return sub(r'HF_HOME = "/data/hf"', f'HF_HOME = "{tmp_path}/hf"', text)


def test_grpo_example_with_stand_in_and_trainer_crash(tmp_path: Path) -> None:
    """The example starts the env server, then vLLM, then the trainer; a crash after
    checkpoint 2 restarts vLLM's own server (the default on_trainer_restart), and the trainer
    resumes from checkpoint-2 only once vLLM is ready again; every checkpoint reaches S3 and
    the daemon exits 0 when training is done."""
    need_module("trl")
    need_module("aiobotocore")
    out = tmp_path / "out"
    trainer = train_command(out, max_steps=4, save_steps=1, callback=True, resume=True,
                            crash_at_step=2)
    cfg = tmp_path / "grpo.toml"
    cfg.write_text(example(tmp_path, free_ports(3), trainer))
    with running_seaweed(need_binary("weed"), tmp_path / "seaweed") as server:
        server.create_bucket("my-checkpoints")
        env = {**QUIET_ENV, "PATH": install_as_vllm(tmp_path / "vllm")["PATH"],
               "TRAIND_STORAGE__ENDPOINT_URL": server.endpoint,
               "TRAIND_STORAGE__ADDRESSING_STYLE": "path",
               "TRAIND_STORAGE__ACCESS_KEY_ID": ACCESS_KEY,
               "TRAIND_STORAGE__SECRET_ACCESS_KEY": SECRET_KEY}
        daemon = DaemonProcess(cfg, env=env)
        try:
            assert daemon.proc.wait(timeout=420) == 0, "".join(daemon.raw[-40:])
        finally:
            daemon.kill()
        listed = subprocess.run(
            [sys.executable, "-m", "traind", "list", "-c", str(cfg), "--json"],
            capture_output=True, text=True, timeout=60, check=True, env={**os.environ, **env},
        )
    assert sorted(r["tag"] for r in json.loads(listed.stdout)) == [
        f"checkpoint-{n}" for n in range(1, 5)]
    ev = daemon.events

    def at(name: str, child: str) -> list[int]:
        return [i for i, e in enumerate(ev) if e.get("event") == name and e.get("child") == child]

    env_ready, vllm_ready = at("health_ready", "env-server"), at("health_ready", "vllm")
    trainer_started = at("child_started", "trainer")
    assert len(at("child_started", "vllm")) == 2
    assert ev[at("child_started", "vllm")[0]]["argv"][:2] == ["vllm", "serve"]
    assert len(trainer_started) == 2
    assert env_ready[0] < vllm_ready[0] < trainer_started[0]
    assert vllm_ready[1] < trainer_started[1]  # resumed only once vLLM was ready again
    reset = daemon.named("vllm_trainer_restart_reset")
    assert [(e["server"], e["action"]) for e in reset] == [("vllm", "restart")]
    resumed = [ev[i]["resume_from"] for i in trainer_started]
    assert resumed == [None, str(out / "checkpoint-2")]


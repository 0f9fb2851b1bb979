"""TraindCallback's heartbeat and completion marker, and the GRPO vLLM arguments."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.requires import need_module

from traind.layout.markers import EXPLICIT_MARKER

if TYPE_CHECKING:
    from transformers import TrainingArguments


@pytest.fixture
def hf() -> ModuleType:
    """``traind.integrations.hf`` (needs torch and transformers: skip locally, fail in CI)."""
    need_module("torch")
    need_module("transformers")
    import traind.integrations.hf

    return traind.integrations.hf


def _args(output_dir: Path) -> TrainingArguments:
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to=[])


def _state(step: int) -> Any:
    from transformers import TrainerState

    return TrainerState(global_step=step)


def _control(should_save: bool = False) -> Any:
    from transformers import TrainerControl

    return TrainerControl(should_save=should_save)


_QUIET: dict[str, Any] = {"report_to": [], "activation_checkpointing": False}


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_no_heartbeat_without_env(
    hf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TRAIND_HEARTBEAT the callback writes no heartbeat anywhere."""
    monkeypatch.delenv("TRAIND_HEARTBEAT", raising=False)
    monkeypatch.chdir(tmp_path)
    callback = hf.TraindCallback()
    callback.on_step_end(_args(tmp_path / "out"), _state(1), _control())
    assert callback.heartbeat is None
    assert list(tmp_path.iterdir()) == []


def test_step_end_writes_heartbeat_with_step(
    hf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step end replaces the heartbeat file with the step, the time and phase "training"."""
    heartbeat = tmp_path / "hb.json"
    monkeypatch.setenv("TRAIND_HEARTBEAT", str(heartbeat))
    before = time.time()
    hf.TraindCallback().on_step_end(_args(tmp_path / "out"), _state(7), _control())
    beat = _read(heartbeat)
    assert (beat["step"], beat["phase"]) == (7, "training")
    assert before <= beat["time"] <= time.time()
    assert [p.name for p in tmp_path.iterdir()] == ["hb.json"]


def test_step_end_before_a_save_reports_saving(hf: ModuleType, tmp_path: Path) -> None:
    """When the step end decided to save, the heartbeat says "saving" until on_save."""
    heartbeat = tmp_path / "hb.json"
    callback = hf.TraindCallback(heartbeat)
    args, state = _args(tmp_path / "out"), _state(3)
    callback.on_step_end(args, state, _control(should_save=True))
    callback.on_log(args, state, _control(should_save=True))
    assert _read(heartbeat)["phase"] == "saving"
    (tmp_path / "out" / "checkpoint-3").mkdir(parents=True)
    callback.on_save(args, state, _control())
    assert (_read(heartbeat)["step"], _read(heartbeat)["phase"]) == (3, "training")


def test_on_save_writes_marker_in_checkpoint(hf: ModuleType, tmp_path: Path) -> None:
    """on_save writes the explicit marker into checkpoint-N and leaves no temporary file."""
    out = tmp_path / "out"
    (out / "checkpoint-5").mkdir(parents=True)
    hf.TraindCallback().on_save(_args(out), _state(5), _control())
    assert _read(out / "checkpoint-5" / EXPLICIT_MARKER)["step"] == 5
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-5"]


def test_on_save_without_checkpoint_dir_writes_nothing(hf: ModuleType, tmp_path: Path) -> None:
    """A save that produced no checkpoint-N directory creates no marker (or directory)."""
    out = tmp_path / "out"
    out.mkdir()
    hf.TraindCallback().on_save(_args(out), _state(9), _control())
    assert list(out.iterdir()) == []


def test_real_training_run_heartbeats_and_marks_every_save(
    hf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a real SFT run: "saving" during each save, then the marker beside trainer_state."""
    need_module("trl")
    from tests.support import tiny_train
    from transformers import TrainerCallback

    for name, value in tiny_train.QUIET_ENV.items():
        monkeypatch.setenv(name, value)

    heartbeat = tmp_path / "hb.json"
    out = tmp_path / "out"

    class Probe(TrainerCallback):  # type: ignore[misc]
        """Records, at on_save, the heartbeat and what the new checkpoint holds."""

        def __init__(self) -> None:
            self.seen: list[tuple[int, str, bool, bool]] = []

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            checkpoint = out / f"checkpoint-{state.global_step}"
            beat = _read(heartbeat)
            has_state = (checkpoint / "trainer_state.json").is_file()
            has_marker = (checkpoint / EXPLICIT_MARKER).is_file()
            self.seen.append((beat["step"], beat["phase"], has_state, has_marker))

    opts = tiny_train.parse_args(["--output-dir", str(out), "--max-steps", "3"])
    before, after = Probe(), Probe()
    trainer = tiny_train.build_trainer(opts, [before, hf.TraindCallback(heartbeat), after])
    trainer.train()

    assert before.seen == [(n, "saving", True, False) for n in (1, 2, 3)]
    assert after.seen == [(n, "training", True, True) for n in (1, 2, 3)]
    for n in (1, 2, 3):
        assert _read(out / f"checkpoint-{n}" / EXPLICIT_MARKER)["step"] == n
    assert (_read(heartbeat)["step"], _read(heartbeat)["phase"]) == (3, "done")


def test_grpo_server_mode_builds_a_grpo_config(hf: ModuleType, tmp_path: Path) -> None:
    """vLLM on other GPUs: server mode at the supervised server, accepted by GRPOConfig."""
    need_module("trl")
    from trl import GRPOConfig

    args = hf.grpo_vllm_args(
        "http://127.0.0.1:8001/", vllm_gpus=[1], trainer_gpus=[0], group_port=51300
    )
    assert args == {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": "http://127.0.0.1:8001",
        "vllm_group_port": 51300,
    }
    config = GRPOConfig(**args, output_dir=str(tmp_path), use_cpu=True, **_QUIET)
    assert (config.use_vllm, config.vllm_mode) == (True, "server")
    assert config.vllm_server_base_url == "http://127.0.0.1:8001"


def test_grpo_colocate_mode_builds_a_grpo_config(hf: ModuleType, tmp_path: Path) -> None:
    """No separate vLLM server: colocate mode, accepted by GRPOConfig."""
    need_module("trl")
    from trl import GRPOConfig

    args = hf.grpo_vllm_args(gpu_memory_utilization=0.25)
    assert args == {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.25,
    }
    config = GRPOConfig(**args, output_dir=str(tmp_path), use_cpu=True, **_QUIET)
    assert (config.vllm_mode, config.vllm_gpu_memory_utilization) == ("colocate", 0.25)


@pytest.mark.parametrize("server_url", [None, "http://127.0.0.1:8001"])
def test_grpo_every_option_is_an_installed_grpo_config_field(
    hf: ModuleType, tmp_path: Path, server_url: str | None
) -> None:
    """With every option set, each key is a field of the installed GRPOConfig and keeps its
    value there (a renamed TRL field fails here, not in a user's run)."""
    need_module("trl")
    import dataclasses

    from trl import GRPOConfig

    args = hf.grpo_vllm_args(
        server_url, vllm_gpus=[1], trainer_gpus=[0], group_port=51300, server_timeout=600.0,
        gpu_memory_utilization=0.4, tensor_parallel_size=1,
    )
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(args) <= fields
    config = GRPOConfig(**args, output_dir=str(tmp_path), use_cpu=True, **_QUIET)
    assert {k: getattr(config, k) for k in args} == args


@pytest.mark.parametrize(
    ("url", "vllm_gpus", "trainer_gpus"),
    [("http://127.0.0.1:8001", [0, 1], [1]), ("127.0.0.1:8001", [1], [0]),
     ("http://127.0.0.1:8001/health", [1], [0])],
)
def test_grpo_server_mode_rejects_shared_gpus_and_bad_urls(
    hf: ModuleType, url: str, vllm_gpus: list[int], trainer_gpus: list[int]
) -> None:
    """Server mode refuses GPUs shared with the trainer, URLs without a scheme, and the health
    URL in place of the root (TRL's client would poll /health/health)."""
    with pytest.raises(ValueError, match=r"GPUs|server_url"):
        hf.grpo_vllm_args(url, vllm_gpus=vllm_gpus, trainer_gpus=trainer_gpus)


def test_snapshot_handshake_waits_then_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under traind the callback waits for the daemon's ack, and stops waiting after a
    timeout instead of stalling every later save."""
    from traind.integrations.hf import TraindCallback
    from traind.layout.markers import ACK_DIR_ENV

    acks = tmp_path / "acks"
    acks.mkdir()
    (acks / "checkpoint-1").touch()
    monkeypatch.setenv(ACK_DIR_ENV, str(acks))
    callback = TraindCallback(ack_timeout=0.2)
    started = time.monotonic()
    callback.wait_for_snapshot("checkpoint-1")
    assert time.monotonic() - started < 0.1
    with pytest.warns(UserWarning, match="did not snapshot checkpoint-2"):
        callback.wait_for_snapshot("checkpoint-2")
    assert callback.ack_dir is None
    started = time.monotonic()
    callback.wait_for_snapshot("checkpoint-3")
    assert time.monotonic() - started < 0.1

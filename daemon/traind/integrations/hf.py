"""A transformers ``TrainerCallback`` that tells traind about progress and finished saves.

Add ``TraindCallback()`` to the trainer's callbacks. It does two things:

- **Heartbeat.** When ``TRAIND_HEARTBEAT`` names a file, it is replaced atomically with
  ``{"step": N, "time": unix_seconds, "phase": P, "pid": PID}`` at train begin, every step
  end, every log, after every save and at train end. ``phase`` is ``"training"``,
  ``"saving"`` (from the step end that decided to save until the save finished, so the
  daemon does not count checkpoint writing as a hang) or ``"done"``.
- **Completion marker.** After each save it writes ``EXPLICIT_MARKER`` into the new
  ``checkpoint-N`` directory, which the watcher trusts over quiet-period heuristics. In a
  job of several processes every one has saved first (a barrier), and the marker goes into
  every node's directory (each node's local main process writes it), so the traind of every
  host knows its part is whole, not only the host of world rank 0.
- **Snapshot handshake.** Under traind (``TRAIND_ACK_DIR`` set) it then waits until the
  daemon holds a snapshot of that checkpoint — milliseconds — so even
  ``save_total_limit=1`` cannot rotate a checkpoint away before traind has it.

This module needs transformers (the ``train`` extra); nothing else in traind imports it.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from traind.layout.markers import ACK_DIR_ENV, EXPLICIT_MARKER

HEARTBEAT_ENV = "TRAIND_HEARTBEAT"
"""Environment variable naming the heartbeat file; unset means no heartbeat."""

Phase = Literal["training", "saving", "done"]


def _write_atomic(path: Path, payload: dict[str, Any], tmp_dir: Path) -> None:
    """Replace ``path`` with ``payload`` as JSON so a reader never sees a partial file."""
    tmp = tmp_dir / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, path)


class TraindCallback(TrainerCallback):
    """Heartbeat for traind's hang detection and an explicit marker on every finished save."""

    def __init__(
        self, heartbeat: str | os.PathLike[str] | None = None, ack_timeout: float = 30.0
    ) -> None:
        """Use ``heartbeat`` as the heartbeat file, else ``$TRAIND_HEARTBEAT``, else none;
        wait up to ``ack_timeout`` seconds per save for traind's snapshot (``$TRAIND_ACK_DIR``)."""
        named = heartbeat if heartbeat is not None else os.environ.get(HEARTBEAT_ENV)
        self.heartbeat = Path(named) if named else None
        acks = os.environ.get(ACK_DIR_ENV)
        self.ack_dir = Path(acks) if acks else None
        self.ack_timeout = ack_timeout

    def beat(self, state: TrainerState, phase: Phase) -> None:
        """Write the heartbeat file (local main process only; one trainer per daemon)."""
        if self.heartbeat is None or not state.is_local_process_zero:
            return
        payload = {
            "step": state.global_step,
            "time": time.time(),
            "phase": phase,
            "pid": os.getpid(),
        }
        _write_atomic(self.heartbeat, payload, self.heartbeat.parent)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """First heartbeat: the model is loaded and, on resume, ``global_step`` restored."""
        self.beat(state, "training")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Heartbeat; says "saving" when this step will be followed by a checkpoint save."""
        # DefaultFlowCallback is registered first, so control.should_save is already decided.
        self.beat(state, _phase(control))

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Heartbeat; with ``save_strategy="epoch"`` the save follows this hook."""
        self.beat(state, _phase(control))

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Heartbeat after an evaluation (a save may still follow)."""
        self.beat(state, _phase(control))

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Heartbeat; logging happens between the step end and the save."""
        self.beat(state, _phase(control))

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Mark the checkpoint just written as complete, then report "training" again.

        Trainer._maybe_log_save_evaluate calls ``on_save`` on every process right after its
        ``_save_checkpoint`` returns. By then that process has written its files (every
        process its ``rng_state_<rank>.pth`` and FSDP/DeepSpeed shards, creating the
        directory on every node; world rank 0 the model, optimizer, scheduler and
        ``trainer_state.json``) and rank 0 has rotated old checkpoints (checked against
        transformers 5.24's trainer.py). Nothing makes the processes wait for each other
        there, so they meet at a barrier before each node's local main process writes the
        marker into its node's directory (creating it on a node whose processes wrote
        nothing: plain DDP with ``save_only_model``, whose part is empty).
        """
        if args.world_size > 1:
            _barrier()
        if args.local_process_index == 0 and args.output_dir is not None:
            run_dir = Path(args.output_dir)
            checkpoint = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if args.world_size > 1:  # a node that wrote nothing of this save (plain DDP with
                checkpoint.mkdir(parents=True, exist_ok=True)  # save_only_model): empty part
            if checkpoint.is_dir():
                payload = {"step": state.global_step, "time": time.time()}
                _write_atomic(checkpoint / EXPLICIT_MARKER, payload, run_dir)
                self.wait_for_snapshot(checkpoint.name)
        self.beat(state, "training")

    def wait_for_snapshot(self, tag: str) -> None:
        """Under traind, block until the daemon holds a snapshot of ``tag`` (milliseconds),
        so the next saves cannot rotate it away first. Gives up after ``ack_timeout`` and
        then stops waiting for the rest of the run (traind is not keeping up or not there)."""
        if self.ack_dir is None:
            return
        deadline = time.monotonic() + self.ack_timeout
        while not (self.ack_dir / tag).exists():
            if time.monotonic() > deadline:
                warnings.warn(
                    f"traind did not snapshot {tag} within {self.ack_timeout:.0f}s; "
                    "no longer waiting for it after saves",
                    stacklevel=2,
                )
                self.ack_dir = None
                return
            time.sleep(0.005)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Last heartbeat: training finished normally."""
        self.beat(state, "done")


def _barrier() -> None:
    """Wait until every process of the job has reached this point (here: finished writing
    its files of a save); nothing to wait for without torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _phase(control: TrainerControl) -> Phase:
    return "saving" if control.should_save else "training"


def grpo_vllm_args(
    server_url: str | None = None,
    *,
    vllm_gpus: Collection[int] = (),
    trainer_gpus: Collection[int] = (),
    group_port: int | None = None,
    server_timeout: float | None = None,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
) -> dict[str, Any]:
    """Return ``trl.GRPOConfig`` keyword arguments for generating with vLLM.

    With ``server_url`` (the root of the supervised ``vllm serve``/``trl vllm-serve``, e.g.
    ``"http://127.0.0.1:8001"``, not its ``/health``) the trainer uses server mode; vLLM must
    then run on GPUs the trainer does not use. Without it vLLM is colocated inside the trainer
    on its GPUs. ``None`` options keep TRL's defaults.
    """
    args: dict[str, Any] = {"use_vllm": True}
    if server_url is None:
        args["vllm_mode"] = "colocate"
        _put(args, "vllm_gpu_memory_utilization", gpu_memory_utilization)
        _put(args, "vllm_tensor_parallel_size", tensor_parallel_size)
        return args
    shared = set(vllm_gpus) & set(trainer_gpus)
    if shared:
        raise ValueError(
            f"vLLM server mode needs GPUs of its own, but GPUs {sorted(shared)} are also the "
            "trainer's; give vLLM other GPUs or drop server_url to colocate"
        )
    parts = urlsplit(server_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"server_url must look like http://HOST:PORT, not {server_url!r}")
    if parts.path.rstrip("/").endswith("/health"):
        raise ValueError(f"server_url is the server's root, not its health URL: {server_url!r} "
                         "(TRL's VLLMClient adds /health, /v1/models, ... itself)")
    # vllm_server_base_url wins over vllm_server_host/port in TRL and keeps the scheme.
    args["vllm_mode"] = "server"
    args["vllm_server_base_url"] = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
    _put(args, "vllm_group_port", group_port)
    _put(args, "vllm_server_timeout", server_timeout)
    return args


def _put(args: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        args[key] = value

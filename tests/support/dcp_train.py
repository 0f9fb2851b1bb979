"""A tiny torch.distributed job: each node saves ``checkpoint-N`` with torch.distributed
.checkpoint into its own output_dir (no shared filesystem), as a multi-node trainer does.

Run under ``torchrun --nnodes=K --nproc-per-node=1 --node-rank=R``: ``dcp_train.py OUTPUT_DIR
STEPS``. Every rank writes ``config.json`` too (the same bytes, or rank-specific ones with
``DCP_CONFIG_PER_RANK=1``), as trainers saving a config on every node do. With
``$TRAIND_RESUME_FROM`` set it loads that checkpoint with ``dcp.load`` and goes on from its
step, printing ``dcp_resumed step=S weight_ok=1`` (the weights are those of step S). With
``DCP_CRASH_RANK=R DCP_CRASH_AT=N DCP_CRASH_ONCE=FILE``, rank R exits 1 before saving step N,
the first time only (FILE is created then). ``DCP_STEP_SECONDS`` pauses after each save.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    initial = model.weight.detach().clone()
    first = 1
    if resume := os.environ.get("TRAIND_RESUME_FROM"):
        state = {"model": model.state_dict(), "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=resume)
        model.load_state_dict(state["model"])
        done = int(state["step"])
        ok = torch.allclose(model.weight, initial + float(done))
        print(f"dcp_resumed step={done} weight_ok={int(ok)} from={resume}", flush=True)
        first = done + 1
    pause = float(os.environ.get("DCP_STEP_SECONDS", "0"))
    for step in range(first, steps + 1):
        _maybe_crash(rank, step)
        with torch.no_grad():
            model.weight.add_(1.0)
        ckpt = out / f"checkpoint-{step}"
        dcp.save({"model": model.state_dict(), "step": torch.tensor(step)}, checkpoint_id=ckpt)
        config = {"step": step, "rank": rank} if os.environ.get("DCP_CONFIG_PER_RANK") else {
            "step": step}
        (ckpt / "config.json").write_text(json.dumps(config))
        dist.barrier()
        print(f"dcp_saved step={step}", flush=True)
        time.sleep(pause)
    dist.destroy_process_group()


def _maybe_crash(rank: int, step: int) -> None:
    """Exit 1 on ``DCP_CRASH_RANK`` before saving ``DCP_CRASH_AT``, once (``DCP_CRASH_ONCE``)."""
    once = os.environ.get("DCP_CRASH_ONCE")
    if (once is None or str(rank) != os.environ.get("DCP_CRASH_RANK")
            or str(step) != os.environ.get("DCP_CRASH_AT") or Path(once).exists()):
        return
    Path(once).touch()
    print(f"dcp_crashing step={step}", flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()

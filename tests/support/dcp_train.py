"""A tiny torch.distributed job: each node saves ``checkpoint-N`` with torch.distributed
.checkpoint into its own output_dir (no shared filesystem), as a multi-node trainer does.

Run under ``torchrun --nnodes=K --nproc-per-node=1 --node-rank=R``: ``dcp_train.py OUTPUT_DIR
STEPS``. Every rank writes ``config.json`` too (the same bytes, or rank-specific ones with
``DCP_CONFIG_PER_RANK=1``), as trainers saving a config on every node do.
"""

from __future__ import annotations

import json
import os
import sys
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
    for step in range(1, steps + 1):
        with torch.no_grad():
            model.weight.add_(1.0)
        ckpt = out / f"checkpoint-{step}"
        dcp.save({"model": model.state_dict(), "step": torch.tensor(step)}, checkpoint_id=ckpt)
        config = {"step": step, "rank": rank} if os.environ.get("DCP_CONFIG_PER_RANK") else {
            "step": step}
        (ckpt / "config.json").write_text(json.dumps(config))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The tiny TRL run of ``tiny_train.py`` with HF Trainer's own push to the Hub switched on,
against the Hub stand-in at ``HF_ENDPOINT`` (what a user switching to traind left there).

Run as a script::

    HF_ENDPOINT=... HF_TOKEN=... python tests/support/trainer_push.py --output-dir DIR
        --repo-id NS/NAME --hub-strategy checkpoint|all_checkpoints [--max-steps N]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import tiny_train


def main() -> int:
    """Train a few steps, saving and pushing every step; exit 0 once every push is done."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--hub-strategy", default="checkpoint")
    parser.add_argument("--max-steps", type=int, default=3)
    opts = parser.parse_args()
    for name, value in tiny_train.QUIET_ENV.items():
        if "OFFLINE" not in name:  # the Hub (stand-in) is reached
            os.environ.setdefault(name, value)
    os.environ["HF_HUB_DISABLE_XET"] = "1"

    import torch
    import transformers
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(1)
    transformers.set_seed(0)
    tokenizer = tiny_train.build_tokenizer()
    model = tiny_train.build_model(len(tokenizer), tokenizer.pad_token_id,
                                   tokenizer.bos_token_id, tokenizer.eos_token_id)
    config = SFTConfig(
        output_dir=str(opts.output_dir), use_cpu=True, report_to=[], max_steps=opts.max_steps,
        save_strategy="steps", save_steps=1, logging_steps=1, per_device_train_batch_size=4,
        learning_rate=1e-3, max_length=32, packing=False, dataloader_num_workers=0,
        dataloader_pin_memory=False, disable_tqdm=True, seed=0, bf16=False, fp16=False,
        activation_checkpointing=False, push_to_hub=True, hub_model_id=opts.repo_id,
        hub_strategy=opts.hub_strategy, hub_private_repo=True,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=tiny_train.build_dataset(),
                         processing_class=tokenizer)
    trainer.train()
    trainer.push_to_hub(blocking=True)
    print("pushed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real, tiny TRL SFT run on the CPU, built entirely in code (no hub access).

Run as a script (it is the trainer command of traind's tests)::

    python tests/support/tiny_train.py --output-dir DIR [--max-steps N] [--save-steps 1]
        [--save-total-limit 2] [--resume] [--crash-at-step K] [--hang-at-step K]
        [--step-sleep SECONDS] [--callback] [--save-only-model] [--hidden-size 32]
        [--leave-orphans]

``--resume`` continues from ``$TRAIND_RESUME_FROM`` when set, else from the newest
``checkpoint-N`` in DIR when there is one; from a checkpoint at ``--max-steps`` it trains
nothing (transformers would train one step more: it checks ``max_steps`` after a step).
``--crash-at-step K`` exits with ``CRASH_EXIT`` right after checkpoint K is saved;
``--hang-at-step K`` sleeps forever there. One line ``step=N loss=X`` is printed (and
flushed) per step. ``--leave-orphans`` first double-forks
two grandchildren in sessions of their own, as daemonizing helpers do: one exits after
``ORPHAN_SECONDS`` (its parent gone, it becomes a zombie of whoever adopted it), the other
sleeps on past the trainer; it prints ``orphans=PID,PID``.

Importing this module is cheap (stdlib only) so tests can use ``train_command``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
CRASH_EXIT = 17
"""Exit status of an injected ``--crash-at-step`` crash."""
ORPHAN_SECONDS = 1.0
"""How long ``--leave-orphans``'s short-lived grandchild lives."""

# fmt: off
_WORDS = [
    "the", "a", "one", "two", "three", "cat", "dog", "bird", "fish", "tree", "sun", "moon",
    "runs", "sees", "eats", "sleeps", "jumps", "big", "small", "red", "blue", "green",
    "fast", "slow", "and", "over", "under", "near",
]
# fmt: on
_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]


def train_command(output_dir: Path, **opts: object) -> list[str]:
    """Return the argv running this script on ``output_dir``.

    Options are the script's flags with ``_`` for ``-``: ``max_steps=4`` gives
    ``--max-steps 4``, ``resume=True`` gives ``--resume``; ``False``/``None`` are omitted.
    """
    argv = [sys.executable, str(SCRIPT), "--output-dir", str(output_dir)]
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--save-steps", type=int, default=1)
    parser.add_argument("--save-total-limit", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--crash-at-step", type=int, default=None)
    parser.add_argument("--hang-at-step", type=int, default=None)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--callback", action="store_true", help="add traind's TraindCallback")
    parser.add_argument("--save-only-model", action="store_true",
                        help="save the model alone (no optimizer, scheduler or RNG state)")
    parser.add_argument("--hidden-size", type=int, default=32,
                        help="the model's width: larger checkpoints (about hidden_size**2)")
    parser.add_argument("--leave-orphans", action="store_true",
                        help="double-fork a short-lived and a long-lived grandchild first")
    return parser.parse_args(argv)


def resume_target(output_dir: Path) -> str | bool | None:
    """What to pass as ``resume_from_checkpoint`` under ``--resume``."""
    explicit = os.environ.get("TRAIND_RESUME_FROM")
    if explicit:
        return explicit
    if any(p.is_dir() for p in output_dir.glob("checkpoint-*")):
        return True
    return None


def resumed_step(target: str | bool, output_dir: Path) -> int:
    """The global step of the checkpoint ``resume_target`` chose."""
    if isinstance(target, str):
        checkpoint = Path(target)
    else:
        checkpoint = max(output_dir.glob("checkpoint-*"),
                         key=lambda p: int(p.name.rpartition("-")[2]))
    step: int = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    return step


QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""Environment for an offline, quiet, single-threaded run (set before the HF imports)."""


def _quiet_environment() -> None:
    for name, value in QUIET_ENV.items():
        if name.endswith("_NUM_THREADS"):
            os.environ.setdefault(name, value)
        else:
            os.environ[name] = value


def build_tokenizer() -> Any:
    """A word-level fast tokenizer over a fixed toy vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )


def build_model(vocab_size: int, pad_id: int, bos_id: int, eos_id: int,
                hidden_size: int = 32) -> Any:
    """A randomly initialised 2-layer Llama with hidden size ``hidden_size``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def build_dataset(n: int = 64) -> Any:
    """Deterministic short sentences in a ``text`` column."""
    from datasets import Dataset

    rows = []
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(4 + i % 5)]
        rows.append(" ".join(words))
    return Dataset.from_dict({"text": rows})


def build_callbacks(opts: argparse.Namespace) -> list[Any]:
    """The step printer, traind's callback when asked, and the fault injectors (last)."""
    from transformers import TrainerCallback

    class StepPrinter(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                print(f"step={state.global_step} loss={logs['loss']:.4f}", flush=True)

    class Faults(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if opts.step_sleep:
                time.sleep(opts.step_sleep)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # Faults fire in the first run only: a restart that resumes from before the
            # faulty step (its checkpoint not committed yet) must not meet it again.
            if os.environ.get("TRAIND_RESUME_FROM"):
                return
            if state.global_step == opts.crash_at_step:
                print(f"crash_injected step={state.global_step}", flush=True)
                sys.stderr.flush()
                os._exit(CRASH_EXIT)
            if state.global_step == opts.hang_at_step:
                print(f"hang_injected step={state.global_step}", flush=True)
                while True:
                    time.sleep(3600)

    callbacks: list[Any] = [StepPrinter()]
    if opts.callback:
        from traind.integrations.hf import TraindCallback

        callbacks.append(TraindCallback())
    callbacks.append(Faults())
    return callbacks


def build_trainer(opts: argparse.Namespace, callbacks: list[Any] | None = None) -> Any:
    """An ``SFTTrainer`` for ``opts``; ``callbacks`` default to ``build_callbacks(opts)``."""
    _quiet_environment()

    import datasets
    import torch
    import transformers
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    transformers.set_seed(0)

    tokenizer = build_tokenizer()
    model = build_model(
        len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
        opts.hidden_size,
    )
    config = SFTConfig(
        output_dir=str(opts.output_dir),
        use_cpu=True,
        report_to=[],
        max_steps=opts.max_steps,
        save_strategy="steps",
        save_steps=opts.save_steps,
        save_total_limit=opts.save_total_limit,
        save_only_model=opts.save_only_model,
        logging_steps=1,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        max_length=32,
        packing=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        seed=0,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,  # TRL's SFTConfig turns it on by default
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=build_dataset(),
        processing_class=tokenizer,
        callbacks=build_callbacks(opts) if callbacks is None else callbacks,
    )
    # disable_tqdm adds a PrinterCallback that prints raw dicts; StepPrinter replaces it.
    trainer.remove_callback(transformers.PrinterCallback)
    return trainer


def orphan(seconds: float) -> int:
    """Double-fork a process in a session of its own that sleeps ``seconds`` then exits; its
    parent is gone before this returns, so it is adopted (by a subreaper or init)."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.close(write)  # the trainer reads the pipe to its end
            time.sleep(seconds)
            os._exit(0)
        os.write(write, str(grandchild).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(middle, 0)
    with os.fdopen(read) as pipe:
        return int(pipe.read())


def main(argv: list[str] | None = None) -> int:
    """Build everything in code and train; return the exit status."""
    opts = parse_args(argv)
    if opts.leave_orphans:
        print(f"orphans={orphan(ORPHAN_SECONDS)},{orphan(3600)}", flush=True)
    resume = resume_target(opts.output_dir) if opts.resume else None
    if resume is not None and (done := resumed_step(resume, opts.output_dir)) >= opts.max_steps:
        # Trainer.train checks max_steps only after a step: it would train step max_steps + 1.
        print(f"train_end global_step={done} seconds=0.00 resumed_at_max_steps", flush=True)
        return 0
    trainer = build_trainer(opts)
    print(f"train_start resume_from={resume}", flush=True)
    started = time.monotonic()
    result = trainer.train(resume_from_checkpoint=resume)
    seconds = time.monotonic() - started
    print(f"train_end global_step={result.global_step} seconds={seconds:.2f}", flush=True)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # Under torchrun, gloo's threads torn down at interpreter exit abort the process now
        # and then ("terminate called without an active exception"), and destroying the
        # group first can hang: the run is over and saved, so leave at once.
        sys.stdout.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

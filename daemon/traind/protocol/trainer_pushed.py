"""Checkpoints another tool wrote where traind stores: HF Trainer's own push to the Hub
(``hub_strategy="checkpoint"`` keeps ``last-checkpoint/``, ``"all_checkpoints"`` every
``checkpoint-N/``, at the repo's root, without a traind manifest).

They are listed and restored, never pruned or written: each becomes a manifest made up from
the store's listing, naming no writer, every file's sha256 the one the store recorded (the
Hub's, for LFS files) or, for a small file kept in git, that of its bytes as read now.
Restoring then verifies what arrives against it like any checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import re

from traind.layout.keys import MANIFEST_NAME
from traind.layout.manifest import FileEntry, Manifest, TrainerFacts, listed, trainer_facts
from traind.storage.base import ObjectMeta, ObjectStore
from traind.util.tasks import fan_out

TRAINER_DIR = re.compile(r"^(last-checkpoint|checkpoint-(\d+))$")
PUSHED_BY = "HF Trainer push"
"""The ``host`` of a manifest made up here: a checkpoint no traind committed."""


async def trainer_checkpoints(root: ObjectStore, run: str, concurrency: int) -> list[Manifest]:
    """Every checkpoint HF Trainer pushed under ``root`` (the repo's root): a directory
    named ``last-checkpoint`` or ``checkpoint-N`` holding ``trainer_state.json`` and no
    traind manifest."""
    names = [n for n in await root.list_dirs("") if TRAINER_DIR.match(n)]

    async def made_up(name: str) -> Manifest | None:
        paths = {m.key[len(name) + 1:]: m for m in await root.list(f"{name}/")}
        if MANIFEST_NAME in paths or "trainer_state.json" not in paths:
            return None

        async def entry(item: tuple[str, ObjectMeta]) -> FileEntry:
            path, meta = item
            if meta.sha256 is not None:
                return FileEntry(path, meta.size, meta.sha256)
            found = await root.get(meta.key)
            data = found.data if found is not None else b""
            return FileEntry(path, len(data), hashlib.sha256(data).hexdigest())

        files = await fan_out(sorted(paths.items()), concurrency, entry)
        state = await root.get(f"{name}/trainer_state.json")
        facts = _facts(state.data if state is not None else b"")
        numbered = TRAINER_DIR.match(name)
        step = int(numbered.group(2)) if numbered and numbered.group(2) else (
            facts.global_step or 0)
        made = Manifest(run, name, step, tuple(files), created_at=0.0, host=PUSHED_BY,
                        trainer=facts, writer=None)
        # validated as a stored manifest is, but for its writer: it has none
        found = listed(made.to_json(), root.where(f"{name}/"), run, name,
                       Manifest.unwritten_from_json)
        return found if isinstance(found, Manifest) else None

    return [m for m in await fan_out(names, concurrency, made_up) if m is not None]


def _facts(data: bytes) -> TrainerFacts:
    try:
        state = json.loads(data)
    except (ValueError, RecursionError):
        return TrainerFacts()
    return trainer_facts(state) if isinstance(state, dict) else TrainerFacts()

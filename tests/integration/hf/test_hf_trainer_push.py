"""A repo holding what HF Trainer's own push wrote (the real transformers Trainer with
``push_to_hub=True`` against the Hub stand-in): traind lists its ``last-checkpoint/`` or
``checkpoint-N/`` and restores the newest byte for byte, verified against the Hub's sha256."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conformance.conftest import hf_config
from tests.support.fake_hub import TOKEN, FakeHub, running_hub
from tests.support.requires import need_module

from traind.checkpoints.restore.download import find, restore
from traind.protocol import open_storage
from traind.protocol.trainer_pushed import PUSHED_BY

PUSH = Path(__file__).parents[2] / "support" / "trainer_push.py"
REPO = "traind/pushed"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """A stand-in for one test."""
    for module in ("huggingface_hub", "transformers", "trl"):
        need_module(module)
    with running_hub() as server:
        yield server


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["checkpoint", "all_checkpoints"])
async def test_trainer_pushed_checkpoint_is_listed_and_restored(
        hub: FakeHub, tmp_path: Path, strategy: str) -> None:
    """After Trainer pushed with hub_strategy="checkpoint" (last-checkpoint/) or
    "all_checkpoints" (checkpoint-N/), traind finds them (no traind manifest), takes the
    step from the name or trainer_state.json, and restores the newest whole, verified."""
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "daemon"),
                                          os.environ.get("PYTHONPATH", "")])}
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(PUSH), "--output-dir", str(tmp_path / "out"), "--repo-id", REPO,
        "--hub-strategy", strategy, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    try:
        async with asyncio.timeout(240):
            output, _ = await child.communicate()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, output.decode()[-3000:]
    storage = open_storage(hf_config(hub, REPO), "run")
    try:
        async with asyncio.timeout(60):
            assert await storage.manifests() == []
            pushed = await storage.foreign_manifests()
            manifest = await find(storage, "latest", pushed)
            dest = await restore(storage, manifest, tmp_path / "restored")
    finally:
        await storage.aclose()
    tree = hub.head("model", REPO).tree
    folders = sorted({p.split("/")[0] for p in tree if "/" in p})
    assert sorted(m.tag for m in pushed) == folders
    if strategy == "checkpoint":
        assert folders == ["last-checkpoint"]
    else:
        assert folders
        assert all(f.startswith("checkpoint-") for f in folders)
    assert manifest.host == PUSHED_BY
    assert manifest.step == manifest.trainer.global_step
    on_hub = {p.removeprefix(f"{manifest.tag}/"): e.data for p, e in tree.items()
              if p.startswith(f"{manifest.tag}/")}
    restored = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*")
                if p.is_file()}
    assert restored == on_hub
    local = tmp_path / "out" / f"checkpoint-{manifest.step}"
    assert {k: (local / k).read_bytes() for k in restored} == restored
    assert any(e.lfs for p, e in tree.items() if p.startswith(f"{manifest.tag}/"))

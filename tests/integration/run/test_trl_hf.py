"""A real tiny TRL run supervised by ``traind run`` streams to the Hub stand-in (Trainer's
own push switched off): every checkpoint one Hub commit of its files and manifest, pruned
as configured, the newest pulled on a fresh directory byte for byte and restored by a
daemon on a fresh host; and a trainer saving faster than the commit budget keeps its
newest and pinned checkpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.integration.run.test_trl_remote import tree_hashes
from tests.support.checkpoints import setup
from tests.support.daemon import DaemonProcess
from tests.support.fake_hub import TOKEN, FakeHub, running_hub
from tests.support.requires import need_module
from tests.support.tiny_train import QUIET_ENV, train_command

REPO = "traind/trl"


def _config(tmp_path: Path, endpoint: str, argv: list[str], storage_extra: str,
            retention: str) -> Path:
    storage = (f'type = "hf"\nrepo_id = "{REPO}"\nendpoint = "{endpoint}"\n'
               f'token = "{TOKEN}"\ncreate_repo = true\npath_in_repo = "runs"\n'
               + storage_extra)
    env = ", ".join(f'{k} = "{v}"' for k, v in QUIET_ENV.items())
    trainer = f"[trainer]\ncommand = {json.dumps(argv)}\nenv = {{ {env} }}\n"
    _, _, cfg = setup(tmp_path, extra=trainer, storage=storage)
    cfg.write_text(cfg.read_text().replace("keep_last = 100", retention))
    return cfg


def test_trl_run_streams_to_the_hub_and_restores(tmp_path: Path) -> None:
    """Checkpoints 1-4 are committed, each one commit of its files and manifest naming it;
    keep_last = 2 leaves 3 and 4, each pruned one gone in one commit; the pulled newest
    equals the trainer's, and a daemon on a fresh host (no output_dir, no state_dir)
    restores it before its trainer starts."""
    need_module("trl")
    need_module("huggingface_hub")
    with running_hub() as hub:
        out = tmp_path / "out"
        argv = train_command(out, max_steps=4, save_steps=1, callback=True)
        cfg = _config(tmp_path, hub.endpoint, argv, "coalesce = false\n", "keep_last = 2")
        daemon = DaemonProcess(cfg, env={"HF_HUB_DISABLE_XET": "1"})
        try:
            assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-30:])
        finally:
            daemon.kill()
        history = hub.commits("model", REPO)
        before = hub.head("model", REPO).tree
        pruned = subprocess.run([sys.executable, "-m", "traind", "prune", "-c", str(cfg)],
                                capture_output=True, text=True, timeout=60)
        prune_commits = len(hub.commits("model", REPO)) - len(history)
        listing = subprocess.run(
            [sys.executable, "-m", "traind", "list", "-c", str(cfg), "--json"],
            capture_output=True, text=True, timeout=60)
        pulled = subprocess.run(
            [sys.executable, "-m", "traind", "pull", "-c", str(cfg), "latest",
             str(tmp_path / "back")], capture_output=True, text=True, timeout=120)
        expected = tree_hashes(out / "checkpoint-4")
        shutil.rmtree(out)
        shutil.rmtree(tmp_path / "state")  # a new host
        fresh = DaemonProcess(cfg, env={"HF_HUB_DISABLE_XET": "1"})
        try:
            restored = fresh.wait_for("checkpoint_restored", timeout=120)
            restored_tree = tree_hashes(out / "checkpoint-4")
            assert fresh.proc.wait(timeout=240) == 0, "".join(fresh.raw[-30:])
        finally:
            fresh.kill()
    assert sorted(e["step"] for e in daemon.named("checkpoint_committed")) == [1, 2, 3, 4]
    for n in (1, 2, 3, 4):
        made = [c for c in history if f": commit checkpoint-{n} " in c.message]
        assert len(made) == 1, [c.message for c in history]  # files and manifest at once
        assert made[0].message.startswith(f"traind exp: commit checkpoint-{n} of writer ")
        assert not [c for c in history if f"checkpoint-{n}/" in c.message]  # no claim commits
        stored = {p for p in made[0].tree if p.startswith(f"runs/exp/checkpoint-{n}/")}
        assert f"runs/exp/checkpoint-{n}/traind-manifest.json" in stored
        assert len(stored) >= 6  # the model, optimizer, scheduler, rng, trainer state
    assert pruned.returncode == 0, pruned.stderr
    gone = {p.split("/")[2] for p in before if p.startswith("runs/exp/")} - {
        "checkpoint-3", "checkpoint-4"}
    assert prune_commits == len(gone)  # one commit per pruned checkpoint (the daemon pruned
    # the others as it went; its last prune may race its exit)
    assert [r["tag"] for r in json.loads(listing.stdout)] == ["checkpoint-3", "checkpoint-4"]
    assert pulled.returncode == 0, pulled.stderr
    expected.pop(".traind-complete", None)
    assert tree_hashes(tmp_path / "back/checkpoint-4") == expected
    assert restored["tag"] == "checkpoint-4"
    assert restored_tree == expected


def test_a_trainer_faster_than_the_commit_budget_keeps_newest_and_pinned(
        tmp_path: Path) -> None:
    """Saving every step against a budget of two commits per three seconds: the daemon
    waits out the 429s, commits the newest and every pinned checkpoint (keep_every_steps =
    4), and each one it skipped is logged as coalesced; none is lost otherwise."""
    need_module("trl")
    need_module("huggingface_hub")
    with running_hub(FakeHub(commit_budget=2, window=3.0)) as hub:
        argv = train_command(tmp_path / "out", max_steps=8, save_steps=1, callback=True)
        cfg = _config(tmp_path, hub.endpoint, argv, "",
                      "keep_last = 100\nkeep_every_steps = 4")
        daemon = DaemonProcess(cfg, env={"HF_HUB_DISABLE_XET": "1"})
        try:
            assert daemon.proc.wait(timeout=240) == 0, "".join(daemon.raw[-30:])
        finally:
            daemon.kill()
    committed = {e["step"] for e in daemon.named("checkpoint_committed")}
    coalesced = {e["step"] for e in daemon.named("checkpoint_coalesced")}
    assert {4, 8} <= committed
    assert committed | coalesced == set(range(1, 9))
    assert not committed & coalesced
    assert "429" in hub.refused
    assert daemon.named("hf_rate_limited")
    print(f"committed {sorted(committed)}, coalesced {sorted(coalesced)}")

"""When each host's part of a multi-node checkpoint is whole: node 0 by the coordinator's
markers, every other host by settle, and at once on every host by TraindCallback's marker,
which a real HF Trainer job under torchrun now writes on every node."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.integration.multinode.test_parts_local import (
    dcp_job,
    event,
    host_configs,
    run_to_end,
    start,
)
from tests.support import tiny_train
from tests.support.daemon import DaemonProcess
from tests.support.net import free_port
from tests.support.requires import need_binary, need_module

from traind.layout.keys import MANIFEST_NAME
from traind.layout.markers import EXPLICIT_MARKER
from traind.layout.parts import Part, part_name

DEFAULT_MARKERS = {"TRAIND_CHECKPOINTS__MARKERS": json.dumps(["trainer_state.json", ".metadata"])}
"""Each host's traind with the default markers (no marker of node 1's own)."""


def hf_job(tmp_path: Path, steps: int, *flags: str) -> None:
    """A real SFT run with TraindCallback under ``torchrun --nnodes=2 --nproc-per-node=1``
    on gloo, each node saving into its own output_dir (``flags`` go to tiny_train); run
    to the end."""
    need_binary("torchrun")
    need_module("trl")
    port = free_port()
    procs = [
        subprocess.Popen(
            ["torchrun", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={rank}",
             "--master-addr=127.0.0.1", f"--master-port={port}", str(tiny_train.SCRIPT),
             "--output-dir", str(tmp_path / f"node{rank}" / "out"), "--max-steps", str(steps),
             "--callback", *flags],
            env={**os.environ, **tiny_train.QUIET_ENV}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for rank in range(2)
    ]
    run_to_end(procs, timeout=240)


def committed_on_every_host(hosts: list[Path], env: dict[str, str], *tags: str) -> None:
    """Start a traind per host, wait until each has committed ``tags``, stop them cleanly."""
    daemons: list[DaemonProcess] = []
    try:
        daemons = [start(cfg, rank, env=env) for rank, cfg in enumerate(hosts)]
        for daemon in daemons:
            for tag in tags:
                event(daemon, "checkpoint_committed", tag)
        assert [daemon.stop() for daemon in daemons] == [0] * len(daemons)
    finally:
        for daemon in daemons:
            daemon.kill()


def test_a_dcp_part_past_node_0_settles_without_a_marker(tmp_path: Path) -> None:
    """With the default markers node 1 of a DCP job (only __1_0.distcp and config.json on
    its disk) stores its part once quiet for settle, and the union is committed."""
    hosts = host_configs(tmp_path, 2)
    dcp_job(tmp_path, steps=1)
    committed_on_every_host(hosts, DEFAULT_MARKERS, "checkpoint-1")
    manifest = json.loads((tmp_path / "store/exp/checkpoint-1" / MANIFEST_NAME).read_text())
    assert sorted(f["path"] for f in manifest["files"]) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "config.json"]


def test_hf_trainer_marks_every_node_and_each_part_completes_by_it(tmp_path: Path) -> None:
    """Under torchrun with two nodes TraindCallback writes its marker into both nodes'
    checkpoint-N (node 1 holds only rng_state_1.pth besides); with settle at one hour the
    marker alone completes each host's part, and the union is committed."""
    hosts = host_configs(tmp_path, 2)
    hf_job(tmp_path, steps=2)
    for rank in range(2):
        for step in (1, 2):
            marker = tmp_path / f"node{rank}/out/checkpoint-{step}" / EXPLICIT_MARKER
            assert json.loads(marker.read_text())["step"] == step
    assert sorted(p.name for p in (tmp_path / "node1/out/checkpoint-2").iterdir()) == [
        EXPLICIT_MARKER, "rng_state_1.pth"]
    env = {**DEFAULT_MARKERS, "TRAIND_CHECKPOINTS__SETTLE": "1h"}
    committed_on_every_host(hosts, env, "checkpoint-1", "checkpoint-2")
    manifest = json.loads((tmp_path / "store/exp/checkpoint-2" / MANIFEST_NAME).read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= paths


def test_a_node_that_wrote_nothing_of_a_save_stores_an_empty_part(tmp_path: Path) -> None:
    """Plain DDP with save_only_model writes nothing on node 1: TraindCallback creates its
    checkpoint-N holding only the marker, node 1 stores an empty part, and the checkpoint
    is committed with node 0's files."""
    hosts = host_configs(tmp_path, 2)
    hf_job(tmp_path, 1, "--save-only-model")
    assert [p.name for p in (tmp_path / "node1/out/checkpoint-1").iterdir()] == [
        EXPLICIT_MARKER]
    env = {**DEFAULT_MARKERS, "TRAIND_CHECKPOINTS__SETTLE": "1h"}
    committed_on_every_host(hosts, env, "checkpoint-1")
    store = tmp_path / "store/exp/checkpoint-1"
    manifest = json.loads((store / MANIFEST_NAME).read_text())
    assert "model.safetensors" in {f["path"] for f in manifest["files"]}
    assert Part.from_json((store / part_name(1)).read_bytes()).files == ()

"""Two and three hosts of one torch.distributed job, one traind each (own output_dir and
state_dir), one store — a local directory, S3 on SeaweedFS, or SSH to sshd: each host
stores its part, the union is committed once all are in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.daemon import DaemonProcess, Event, write_config
from tests.support.net import free_port
from tests.support.requires import need_binary, need_module
from tests.support.stores import StoreView, running_store

from traind.layout.keys import MANIFEST_NAME
from traind.layout.parts import Part, part_name

SCRIPT = Path(__file__).parents[2] / "support" / "dcp_train.py"
TAGS = ["checkpoint-1", "checkpoint-2"]
MARKERS = json.dumps([".metadata", "__1_0.distcp", "__2_0.distcp"])  # only node 0 has .metadata
RANK_FROM = ("NODE_RANK", "SLURM_NODEID", "JOB_COMPLETION_INDEX")  # one scheduler's per host


def dcp_job(tmp_path: Path, steps: int, env: dict[str, str] | None = None, nodes: int = 2
            ) -> None:
    """Run the gloo job to the end: each node saves into its own output_dir."""
    need_binary("torchrun")
    need_module("torch")
    port = free_port()
    procs = [
        subprocess.Popen(
            ["torchrun", f"--nnodes={nodes}", "--nproc-per-node=1", f"--node-rank={rank}",
             "--master-addr=127.0.0.1", f"--master-port={port}", str(SCRIPT),
             str(tmp_path / f"node{rank}" / "out"), str(steps)],
            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for rank in range(nodes)
    ]
    run_to_end(procs, timeout=120)


def run_to_end(procs: list[subprocess.Popen[str]], timeout: float) -> None:
    """Wait for every process of a job to exit 0; kill the groups of any left running."""
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, out
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)


def host_configs(tmp_path: Path, nodes: int, storage: str | None = None) -> list[Path]:
    """Each host's traind config: the same run and store (by default a local one at
    ``tmp_path/store``)."""
    storage = storage or f'type = "local"\npath = "{tmp_path / "store"}"'
    configs = []
    for rank in range(nodes):
        root = tmp_path / f"node{rank}"
        (root / "out").mkdir(parents=True)
        configs.append(write_config(root / "traind.toml", run="exp", output_dir=root / "out",
                                    state_dir=root / "state", storage=storage))
    return configs


@pytest.fixture(params=["local", "s3", "ssh"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, StoreView]]:
    """A fresh store of each kind: its [storage] body, and a view of run ``exp`` in it."""
    with running_store(str(request.param), tmp_path, run="exp") as found:
        yield found


@pytest.fixture
def hosts(tmp_path: Path, store: tuple[str, StoreView]) -> list[Path]:
    """Two hosts' traind configs, on the store of the parameter."""
    return host_configs(tmp_path, 2, store[0])


def start(cfg: Path, rank: int, nodes: int = 2, env: dict[str, str] | None = None
          ) -> DaemonProcess:
    env = {"TRAIND_RUN__NODES": str(nodes), RANK_FROM[rank]: str(rank),
           "TRAIND_CHECKPOINTS__MARKERS": MARKERS, **(env or {})}
    return DaemonProcess(cfg, env=env)


def event(daemon: DaemonProcess, name: str, tag: str, timeout: float = 90) -> Event:
    return daemon.wait_for(lambda e: e.get("event") == name and e.get("tag") == tag, timeout)


@pytest.mark.parametrize(("store", "nodes"), [("local", 2), ("local", 3), ("s3", 2),
                                             ("s3", 3), ("ssh", 2)], indirect=["store"])
def test_union_committed_once_every_host_part_is_in(
    tmp_path: Path, nodes: int, store: tuple[str, StoreView]
) -> None:
    """The daemons of all hosts but the last store their parts but commit nothing (no
    checkpoint listed with a part missing); once the last host's daemon starts, late, each
    checkpoint is committed once with the union of all hosts' files, loadable by
    torch.distributed.checkpoint."""
    hosts = host_configs(tmp_path, nodes, store[0])
    dcp_job(tmp_path, steps=2, nodes=nodes)
    view = store[1]
    daemons = []
    try:
        daemons = [start(cfg, rank, nodes) for rank, cfg in enumerate(hosts[:-1])]
        for rank, daemon in enumerate(daemons):
            for tag in TAGS:
                stored = event(daemon, "checkpoint_part_stored", tag)
                assert stored["node_rank"] == rank
                assert nodes - 1 in stored["missing"]
            source = daemon.wait_for("daemon_starting")["node_rank_from"]
            assert source == f"${RANK_FROM[rank]}"
        assert not [n for n in view.names() if n.endswith(f"/{MANIFEST_NAME}")]
        shown = subprocess.run([sys.executable, "-m", "traind", "status", "--json", "-c",
                                str(hosts[0])], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        waiting = {p["tag"]: p for p in json.loads(shown.stdout)["parts"]}
        assert sorted(waiting) == TAGS
        assert all(nodes - 1 in p["missing"] and 0 in p["present"] for p in waiting.values())
        listed = subprocess.run([sys.executable, "-m", "traind", "list", "-c", str(hosts[0])],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "checkpoint-" not in listed.stdout
        daemons.append(start(hosts[-1], nodes - 1, nodes))
        for daemon in daemons:
            for tag in TAGS:
                event(daemon, "checkpoint_committed", tag)
        assert [daemon.stop() for daemon in daemons] == [0] * nodes
    finally:
        for daemon in daemons:
            daemon.kill()
    data = [f"__{rank}_0.distcp" for rank in range(nodes)]
    for tag in TAGS:
        manifest = json.loads(view.read(tag, MANIFEST_NAME) or b"")
        assert sorted(f["path"] for f in manifest["files"]) == [".metadata", *data,
                                                                "config.json"]
        parts = [Part.from_json(view.read(tag, part_name(r)) or b"") for r in range(nodes)]
        assert {f.path for f in parts[1].files} == {"__1_0.distcp", "config.json"}
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"model": torch.nn.Linear(64, 64).state_dict(), "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=view.copy("checkpoint-2", tmp_path / "copied"))
    assert int(state["step"]) == 2
    torch.manual_seed(0)
    assert torch.allclose(state["model"]["weight"], torch.nn.Linear(64, 64).weight + 2.0)


def test_same_path_with_other_bytes_is_never_committed(
    tmp_path: Path, hosts: list[Path], store: tuple[str, StoreView]
) -> None:
    """Both hosts save config.json with different bytes: the second to store it fails the
    checkpoint loudly (checkpoint_parts_disagree), the first's file is not overwritten, and
    no manifest is written."""
    dcp_job(tmp_path, steps=1, env={"DCP_CONFIG_PER_RANK": "1"})
    view = store[1]
    first = start(hosts[0], 0)
    second = None
    try:
        event(first, "checkpoint_part_stored", "checkpoint-1")
        second = start(hosts[1], 1)
        refused = event(second, "checkpoint_parts_disagree", "checkpoint-1")
        assert "config.json" in str(refused["error"])
        assert refused["level"] == "error"
        assert first.stop() == 75  # its part is stored, the checkpoint never committed
        assert second.stop() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert json.loads(view.read("checkpoint-1", "config.json") or b"") == {"step": 1,
                                                                            "rank": 0}
    assert view.read("checkpoint-1", MANIFEST_NAME) is None
    assert (tmp_path / "node1" / "out" / "checkpoint-1" / "config.json").exists()


@pytest.mark.parametrize("store", ["local"], indirect=True)
def test_host_killed_while_waiting_commits_after_restart(
    tmp_path: Path, hosts: list[Path]
) -> None:
    """Node 0's daemon, SIGKILLed while its part waits for node 1's, starts again, sends
    nothing twice, and both hosts commit the union once node 1's daemon comes."""
    dcp_job(tmp_path, steps=1)
    store = tmp_path / "store" / "exp" / "checkpoint-1"
    first = start(hosts[0], 0)
    try:
        event(first, "checkpoint_part_stored", "checkpoint-1")
    finally:
        first.kill()
    inode = (store / "__0_0.distcp").stat().st_ino
    again, second = start(hosts[0], 0), start(hosts[1], 1)
    try:
        for daemon in (again, second):
            event(daemon, "checkpoint_committed", "checkpoint-1")
        assert again.stop() == 0
        assert second.stop() == 0
    finally:
        again.kill()
        second.kill()
    assert (store / "__0_0.distcp").stat().st_ino == inode
    manifest = json.loads((store / MANIFEST_NAME).read_text())
    assert len(manifest["files"]) == 4


def test_only_node_0_prunes_the_store_and_no_part_is_left(
    tmp_path: Path, hosts: list[Path], store: tuple[str, StoreView]
) -> None:
    """With keep_last = 1 the store ends with the newest checkpoint alone, no other tag's
    part or claim left behind; node 0 alone deletes from the store, and every host prunes
    its own output_dir of what is committed."""
    dcp_job(tmp_path, steps=3)
    keep = {"TRAIND_RETENTION__KEEP_LAST": "1", "TRAIND_RETENTION__KEEP_LOCAL": "1"}
    daemons = [start(cfg, rank, env=keep) for rank, cfg in enumerate(hosts)]
    view = store[1]
    try:
        for daemon in daemons:
            event(daemon, "checkpoint_committed", "checkpoint-3")
        deadline = time.monotonic() + 60
        while view.tags() != ["checkpoint-3"]:
            assert time.monotonic() < deadline, view.tags()
            time.sleep(0.5)
        for rank in range(len(daemons)):
            out = tmp_path / f"node{rank}" / "out"
            while sorted(p.name for p in out.iterdir()) != ["checkpoint-3"]:
                assert time.monotonic() < deadline, sorted(p.name for p in out.iterdir())
                time.sleep(0.2)
        assert [daemon.stop() for daemon in daemons] == [0, 0]
    finally:
        for daemon in daemons:
            daemon.kill()
    pruned = [[e["tag"] for e in d.named("checkpoint_pruned") if e["where"] == "remote"]
              for d in daemons]
    assert sorted(pruned[0]) == ["checkpoint-1", "checkpoint-2"]
    assert pruned[1] == []

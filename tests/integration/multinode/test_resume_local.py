"""Hosts of one torch.distributed job, one traind each (own output_dir and state_dir) with
the job's torchrun as its [trainer], one store (local; a crash and wiped hosts also on S3 on
SeaweedFS and SSH to sshd): every trainer start of every host resumes from the same
globally committed checkpoint, made whole on that host's disk."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.multinode.test_parts_local import MARKERS, RANK_FROM, SCRIPT, dcp_job
from tests.support.daemon import DaemonProcess, Event, write_config
from tests.support.net import free_port
from tests.support.requires import need_binary, need_module
from tests.support.stores import StoreView, running_store

from traind.layout.keys import AGREEMENT_DIR, MANIFEST_NAME

WAIT = 240.0
"""Seconds any one wait of these tests may take: torchrun starts slowly on a loaded host."""
_RESUMED = re.compile(r"dcp_resumed step=(\d+) weight_ok=(\d)")


@pytest.fixture(params=["local", "s3", "ssh"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, StoreView]]:
    """A fresh store of each kind: its [storage] body, and a view of run ``exp`` in it."""
    with running_store(str(request.param), tmp_path, run="exp") as found:
        yield found


def configs(tmp_path: Path, nodes: int, steps: int, env: dict[str, str] | None = None,
            storage: str | None = None) -> list[Path]:
    """Each host's traind config: the same run and store (``storage``, else a local one),
    and as its trainer this host's torchrun of the job (``steps`` steps, one master port)."""
    need_binary("torchrun")
    need_module("torch")
    port = free_port()
    out = []
    for rank in range(nodes):
        root = tmp_path / f"node{rank}"
        (root / "out").mkdir(parents=True, exist_ok=True)
        argv = ["torchrun", f"--nnodes={nodes}", "--nproc-per-node=1", f"--node-rank={rank}",
                "--master-addr=127.0.0.1", f"--master-port={port}", str(SCRIPT),
                str(root / "out"), str(steps)]
        table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in (env or {}).items())
        trainer = (f"[trainer]\ncommand = {json.dumps(argv)}\nenv = {{ {table} }}\n"
                   'stop_grace = "5s"\n'
                   'restart = { backoff_initial = "0.5s", backoff_max = "1s" }\n')
        out.append(write_config(root / "traind.toml", run="exp", output_dir=root / "out",
                                state_dir=root / "state", extra=trainer,
                                storage=storage or
                                f'type = "local"\npath = "{tmp_path / "store"}"'))
    return out


def start(cfg: Path, rank: int, nodes: int, env: dict[str, str] | None = None
          ) -> DaemonProcess:
    return DaemonProcess(cfg, env={"TRAIND_RUN__NODES": str(nodes), RANK_FROM[rank]: str(rank),
                                   "TRAIND_CHECKPOINTS__MARKERS": MARKERS, **(env or {})})


def run_to_end(hosts: list[Path], env: dict[str, str] | None = None) -> list[DaemonProcess]:
    """Start every host's daemon (rank = position) and wait until each exits 0 by itself;
    killed on the way out whatever happens."""
    daemons = [start(cfg, rank, len(hosts), env) for rank, cfg in enumerate(hosts)]
    try:
        assert [finished(d) for d in daemons] == [0] * len(hosts), [d.raw[-30:] for d in daemons]
    finally:
        for daemon in daemons:
            daemon.kill()
    return daemons


def resumed(daemon: DaemonProcess) -> list[int]:
    """The steps this host's trainer starts loaded, in order (each with the right weights)."""
    steps = []
    for e in daemon.named("child_output"):
        if m := _RESUMED.search(str(e.get("line", ""))):
            assert m[2] == "1", e
            steps.append(int(m[1]))
    return steps


def agreed(daemon: DaemonProcess) -> list[tuple[int, str | None]]:
    """The rounds and tags of the resume points this host was told."""
    return [(e["round"], e["tag"]) for e in daemon.named("resume_point_agreed")]


def finished(daemon: DaemonProcess) -> int:
    """Wait for the daemon to exit by itself (the trainer finished, all committed)."""
    return daemon.proc.wait(timeout=WAIT)


def wait_event(daemon: DaemonProcess, name: str, **fields: object) -> Event:
    return daemon.wait_for(lambda e: e.get("event") == name
                           and all(e.get(k) == v for k, v in fields.items()), WAIT)


def test_a_rank_crashing_once_restarts_every_host_from_one_committed_step(
    tmp_path: Path, store: tuple[str, StoreView],
) -> None:
    """Rank 1 crashes right after saving step 2, before its hosts can have found that
    checkpoint complete (a 3 s settle): both trainers are restarted only once each host
    stored its part, and both resume from checkpoint-2 (committed by then) with its
    weights, by one decision of round 2; the run then finishes and commits every step."""
    env = {"DCP_CRASH_RANK": "1", "DCP_CRASH_AT": "3",
           "DCP_CRASH_ONCE": str(tmp_path / "crashed")}
    hosts = configs(tmp_path, 2, steps=4, env=env, storage=store[0])
    slow = {"TRAIND_CHECKPOINTS__SETTLE": "3s"}
    daemons = run_to_end(hosts, slow)
    assert (tmp_path / "crashed").exists()
    assert [resumed(d) for d in daemons] == [[2], [2]]
    assert [agreed(d) for d in daemons] == [[(1, None), (2, "checkpoint-2")]] * 2
    for step in range(1, 5):
        assert store[1].read(f"checkpoint-{step}", MANIFEST_NAME) is not None
    for daemon in daemons:
        assert not daemon.named("checkpoint_parts_disagree")
        assert not daemon.named("checkpoint_rewritten")


def test_wiped_hosts_restore_the_whole_checkpoint_and_resume_from_one_step(
    tmp_path: Path, store: tuple[str, StoreView],
) -> None:
    """Both hosts' output_dir and state_dir wiped after a run: each host fetches the whole
    union of the newest committed checkpoint (other hosts' files and .metadata too), never
    stores it again as a save of its own, and both trainers resume from it."""
    hosts = configs(tmp_path, 2, steps=2, storage=store[0])
    run_to_end(hosts)
    for rank in range(2):
        shutil.rmtree(tmp_path / f"node{rank}")
    hosts = configs(tmp_path, 2, steps=3, storage=store[0])
    daemons = run_to_end(hosts)
    assert [resumed(d) for d in daemons] == [[2], [2]]
    union = sorted(f["path"] for f in json.loads(
        store[1].read("checkpoint-2", MANIFEST_NAME) or b"{}")["files"])
    assert union == [".metadata", "__0_0.distcp", "__1_0.distcp", "config.json"]
    for rank in range(2):
        held = tmp_path / f"node{rank}" / "out" / "checkpoint-2"
        assert sorted(p.name for p in held.iterdir()) == union
        assert wait_event(daemons[rank], "checkpoint_restored", tag="checkpoint-2")
        restored = [e for e in daemons[rank].named("checkpoint_staged")
                    if e["tag"] == "checkpoint-2"]
        assert not restored  # not taken for a new save of this host
        assert not daemons[rank].named("checkpoint_conflict")


@pytest.mark.parametrize("nodes", [2, 3])
def test_late_host_is_waited_for_and_every_host_starts_from_one_point(
    tmp_path: Path, nodes: int
) -> None:
    """The job saved two steps; node 0's daemon starts alone and waits for the last node
    (waiting_for_resume_point, shown by traind status); a SIGTERM during the wait stops it
    cleanly and withdraws its request; started again, then the others late, every host's
    trainer resumes from checkpoint-2, which node 0 could not see committed alone."""
    dcp_job(tmp_path, steps=2, nodes=nodes)
    hosts = configs(tmp_path, nodes, steps=3)
    requests = tmp_path / "store" / "exp" / AGREEMENT_DIR
    first = start(hosts[0], 0, nodes)
    try:
        waiting = wait_event(first, "waiting_for_resume_point", missing=list(range(1, nodes)))
        assert waiting["node_rank"] == 0
        shown = subprocess.run([sys.executable, "-m", "traind", "status", "--json", "-c",
                                str(hosts[0])], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["resume"]["missing"] == list(range(1, nodes))
        assert len(list(requests.glob("start-0-*"))) == 1
        assert first.stop(signal.SIGTERM, timeout=60) == 75  # its parts wait, uncommitted
        assert not list(requests.glob("start-0-*"))
        assert not first.named("child_started")
    finally:
        first.kill()
    daemons = [start(hosts[0], 0, nodes)]
    try:
        wait_event(daemons[0], "waiting_for_resume_point", missing=list(range(1, nodes)))
        daemons += [start(cfg, rank, nodes) for rank, cfg in enumerate(hosts) if rank]
        assert [finished(d) for d in daemons] == [0] * nodes, [d.raw[-30:] for d in daemons]
    finally:
        for daemon in daemons:
            daemon.kill()
    assert [resumed(d) for d in daemons] == [[2]] * nodes
    assert len({tuple(agreed(d)) for d in daemons}) == 1
    data = sorted(f"__{r}_0.distcp" for r in range(nodes))
    for rank in range(nodes):
        held = tmp_path / f"node{rank}" / "out" / "checkpoint-2"
        assert sorted(p.name for p in held.iterdir()) == [".metadata", *data, "config.json"]


def test_a_finished_trainers_last_saves_are_committed_on_unmarked_hosts(tmp_path: Path) -> None:
    """With the default markers node 1 of a DCP job never sees a marker, and with a settle
    of an hour nothing completes while the trainers run: once they exit 0, the last scan on
    every host hands on each save (node 1's by its files alone), every checkpoint is
    committed and both daemons exit by themselves."""
    hosts = configs(tmp_path, 2, steps=2)
    env = {"TRAIND_CHECKPOINTS__MARKERS": json.dumps(["trainer_state.json", ".metadata"]),
           "TRAIND_CHECKPOINTS__SETTLE": "1h"}
    run_to_end(hosts, env)
    for tag in ("checkpoint-1", "checkpoint-2"):
        manifest = json.loads((tmp_path / "store/exp" / tag / MANIFEST_NAME).read_text())
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {
            f["path"] for f in manifest["files"]}

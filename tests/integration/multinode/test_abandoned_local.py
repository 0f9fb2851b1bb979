"""A checkpoint whose parts never all arrive (a host died for good): node 0 reports it and
deletes it from the store after ``run.part_timeout``; it is never listed, and the other
hosts let their part go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.multinode.test_part_claims_local import store
from tests.integration.multinode.test_parts_local import dcp_job, event, host_configs, start
from traind.checkpoints.commit.lifecycle import PartsGoneError, PartsPendingError
from traind.checkpoints.commit.streamer import Streamer
from traind.checkpoints.intake.watcher import StageResult
from traind.checkpoints.state.identity import RunIdentity
from traind.checkpoints.state.journal import Journal

from traind.layout.markers import EXPLICIT_MARKER
from traind.util.nodes import NodeRank

TAG = "checkpoint-1"
QUICK = {"TRAIND_RUN__PART_TIMEOUT": "15s", "TRAIND_RETENTION__INTERVAL": "500ms"}
"""A part_timeout above the waiting hosts' longest pause between re-checks (10 s)."""


def test_parts_that_never_all_arrive_are_reported_and_deleted_by_node_0(tmp_path: Path) -> None:
    """Of three hosts node 2's daemon never starts: node 0 logs checkpoint_parts_abandoned
    at error level (present 0 and 1, missing 2, the age), shown in traind status, and
    deletes the tag from the store; node 1 finds its part gone; nothing is ever listed, and
    every host's output_dir keeps its copy. The waiting hosts' re-checks do not make their
    parts look new."""
    hosts = host_configs(tmp_path, 3)
    dcp_job(tmp_path, steps=1, nodes=3)
    store = tmp_path / "store" / "exp"
    daemons = []
    try:
        daemons = [start(cfg, rank, nodes=3, env=QUICK) for rank, cfg in enumerate(hosts[:2])]
        for daemon in daemons:
            event(daemon, "checkpoint_part_stored", TAG)
        listed = subprocess.run([sys.executable, "-m", "traind", "list", "-c", str(hosts[1])],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "checkpoint-" not in listed.stdout
        given_up = event(daemons[0], "checkpoint_parts_abandoned", TAG)
        assert given_up["level"] == "error"
        assert (given_up["present"], given_up["missing"]) == ([0, 1], [2])
        assert given_up["age"] >= 15
        event(daemons[1], "checkpoint_pruned_while_waiting", TAG)
        shown = subprocess.run([sys.executable, "-m", "traind", "status", "--json", "-c",
                                str(hosts[0])], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert "checkpoint_parts_abandoned" in [e["event"] for e in status["errors"]]
        assert status["parts"] == []
        assert [daemon.stop() for daemon in daemons] == [0, 0]
    finally:
        for daemon in daemons:
            daemon.kill()
    assert not (store / TAG).exists()
    assert not daemons[1].named("checkpoint_parts_abandoned")  # node 0 alone deletes
    for rank in range(3):
        assert (tmp_path / f"node{rank}" / "out" / TAG / f"__{rank}_0.distcp").is_file()


async def test_an_empty_part_given_up_by_node_0_is_not_claimed_again(tmp_path: Path) -> None:
    """A host that wrote nothing of a save (only TraindCallback's marker) stores an empty
    part; once node 0 deletes the checkpoint its re-check finds the part gone and claims
    nothing again, so no orphan claim is left in the store."""
    backend = store(tmp_path)
    src = tmp_path / "out1" / "checkpoint-4"
    src.mkdir(parents=True)
    (src / EXPLICIT_MARKER).write_text("{}")
    journal = Journal(tmp_path / "state1" / "journal.sqlite3",
                      RunIdentity("run", src.parent, backend.describe))
    streamer = Streamer("run", tmp_path / "state1", backend, journal,
                        node=NodeRank(1, 2, "test"))
    assert await streamer.stage("checkpoint-4", 4, src) is StageResult.STAGED
    with pytest.raises(PartsPendingError):
        await streamer.commit("checkpoint-4")
    assert [p.files for p in await backend.parts("checkpoint-4")] == [()]
    await backend.delete("checkpoint-4")  # node 0 gave it up: its part never came
    with pytest.raises(PartsGoneError):
        await streamer.commit("checkpoint-4")
    assert not (tmp_path / "store" / "run" / "checkpoint-4").exists()
    journal.close()

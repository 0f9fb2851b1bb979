"""A checkpoint whose parts never all arrive (a host died for good): node 0 reports it and
deletes it from the store after ``run.part_timeout``; it is never listed, and the other
hosts let their part go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.multinode.test_parts_local import dcp_job, event, host_configs, start

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

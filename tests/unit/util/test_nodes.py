"""Which host of a job this traind is: run.node_rank, else the scheduler's environment."""

from __future__ import annotations

import pytest

from traind.util.nodes import RANK_VARIABLES, NodeRank, RankError, resolve


def test_one_node_is_rank_0_whatever_the_environment_says() -> None:
    """With nodes = 1 the scheduler's variables change nothing: rank 0, as before."""
    env = {name: "3" for name in RANK_VARIABLES}
    assert resolve(1, None, env) == NodeRank(0, 1, "single node")


def test_configured_rank_wins_over_the_environment() -> None:
    """run.node_rank, when set, is used even where a scheduler set a rank too."""
    assert resolve(4, 2, {"SLURM_NODEID": "1"}) == NodeRank(2, 4, "run.node_rank")


@pytest.mark.parametrize("name", RANK_VARIABLES)
def test_each_scheduler_variable_gives_the_rank(name: str) -> None:
    """Each scheduler's variable alone gives the rank, and is named as its source."""
    assert resolve(2, None, {name: "1"}) == NodeRank(1, 2, f"${name}")


def test_variables_are_tried_in_order() -> None:
    """Several set at once: the first of RANK_VARIABLES wins (SkyPilot before NODE_RANK)."""
    env = {"NODE_RANK": "0", "SKYPILOT_NODE_RANK": "1", "SLURM_NODEID": "0"}
    assert resolve(2, None, env) == NodeRank(1, 2, "$SKYPILOT_NODE_RANK")


def test_empty_variable_is_skipped() -> None:
    """A variable set to nothing (an unset template value) is not a rank."""
    assert resolve(2, None, {"SKYPILOT_NODE_RANK": " ", "NODE_RANK": "1"}).source == "$NODE_RANK"


def test_several_nodes_without_a_rank_are_refused() -> None:
    """nodes > 1 and no rank anywhere: refused, saying how to give one."""
    with pytest.raises(RankError, match=r"run.nodes = 2 but no node rank: set run.node_rank"):
        resolve(2, None, {})


@pytest.mark.parametrize(
    ("configured", "env", "message"),
    [
        (2, {}, r"run.node_rank = 2: not a node rank of run.nodes = 2 \(allowed: 0..1\)"),
        (None, {"SLURM_NODEID": "5"}, r"\$SLURM_NODEID = 5: not a node rank of run.nodes = 2"),
        (None, {"NODE_RANK": "-1"}, r"\$NODE_RANK = '-1': not a node rank"),
        (None, {"NODE_RANK": "one"}, r"\$NODE_RANK = 'one': not a node rank"),
        (1, {}, r"run.node_rank = 1: not a node rank of run.nodes = 1"),
    ],
)
def test_rank_outside_the_job_is_refused(
    configured: int | None, env: dict[str, str], message: str
) -> None:
    """A rank that is not in 0..nodes-1 (or not a number) is refused, naming its source."""
    nodes = 1 if configured == 1 else 2
    with pytest.raises(RankError, match=message):
        resolve(nodes, configured, env)

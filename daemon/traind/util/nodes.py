"""Which host of a multi-node job this traind runs on: ``[run] node_rank``, else the rank
the scheduler put in the environment.

Pure: the environment is passed in. Every host of a job runs its own traind with the same
``run.name`` and store; the rank tells their parts of a checkpoint apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from traind.errors import TraindError

RANK_VARIABLES = (
    "SKYPILOT_NODE_RANK",  # SkyPilot, on every node of a num_nodes task
    "DSTACK_NODE_RANK",  # dstack tasks with nodes > 1
    "SLURM_NODEID",  # SLURM, in every srun step
    "JOB_COMPLETION_INDEX",  # Kubernetes indexed Jobs
    "NODE_RANK",  # torchrun / Lightning convention, set by hand or by a launcher
)
"""The scheduler variables a rank is read from when ``[run] node_rank`` is not set, in
the order they are tried."""

SINGLE = "single node"
CONFIG = "run.node_rank"


class RankError(TraindError):
    """No usable node rank for a job of several hosts (the message names what is wrong)."""


@dataclass(frozen=True)
class NodeRank:
    """This host's ``rank`` in a job of ``nodes`` hosts, and where the rank came from:
    ``run.node_rank``, a scheduler variable's name, or ``single node``."""

    rank: int
    nodes: int
    source: str


def resolve(nodes: int, configured: int | None, environ: Mapping[str, str]) -> NodeRank:
    """This host's rank: the configured one, else the first of ``RANK_VARIABLES`` set in
    ``environ``; with one node always 0 (a scheduler's variables change nothing then).
    Raise RankError when ``nodes > 1`` and no rank is found, or the rank is not in
    0..nodes-1."""
    if nodes == 1 and configured is None:
        return NodeRank(0, 1, SINGLE)
    if configured is not None:
        return _checked(configured, nodes, CONFIG)
    for name in RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit():
            raise RankError(f"${name} = {value!r}: not a node rank (a whole number "
                            f"0..{nodes - 1}); set run.node_rank to override it")
        return _checked(int(value), nodes, f"${name}")
    raise RankError(f"run.nodes = {nodes} but no node rank: set run.node_rank (or "
                    f"TRAIND_RUN__NODE_RANK), or start traind under a scheduler that sets "
                    f"one of {', '.join(RANK_VARIABLES)}")


def _checked(rank: int, nodes: int, source: str) -> NodeRank:
    if not 0 <= rank < nodes:
        raise RankError(f"{source} = {rank}: not a node rank of run.nodes = {nodes} "
                        f"(allowed: 0..{nodes - 1})")
    return NodeRank(rank, nodes, source)

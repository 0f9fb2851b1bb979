"""A child's environment: what it inherits from the daemon, what is dropped, and what is pinned."""

from __future__ import annotations

from collections.abc import Mapping

from traind.config import ChildConfig, TrainerConfig
from traind.supervisor.policy import Role

CHILD_TAG = "TRAIND_CHILD_ID"
"""Set in every child's environment; descendants inherit it, which finds escaped ones in /proc."""
DISTRIBUTED_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
     "MASTER_ADDR", "MASTER_PORT"}
)
SINGLE_NODE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
RUNTIME_VARS = frozenset({"TRAIND_RESUME_FROM", "TRAIND_HEARTBEAT", CHILD_TAG})


def _dropped(name: str, role: Role) -> bool:
    if name == "NOTIFY_SOCKET" or name.startswith("WATCHDOG_") or name in RUNTIME_VARS:
        return True
    distributed = name in DISTRIBUTED_VARS or name.startswith("TORCHELASTIC_")
    return distributed and role is not Role.TRAINER


def child_env(base_env: Mapping[str, str], config: ChildConfig, role: Role) -> dict[str, str]:
    """The environment for a child: ``base_env`` without systemd's and (except for the trainer)
    torch.distributed's variables, GPUs pinned by PCI order, then the configured ``env``.

    Python children are unbuffered unless told otherwise, so their output (progress) streams.
    A trainer with ``distributed = true`` gets a single-node rank-0 environment by default.
    """
    env = {k: v for k, v in base_env.items() if not _dropped(k, role)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    if role is Role.TRAINER and isinstance(config, TrainerConfig) and config.distributed:
        for key, value in SINGLE_NODE.items():
            env.setdefault(key, value)
    if config.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in config.gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(config.env)
    return env

"""A child's environment: what it inherits from the daemon, what is dropped, and what is pinned."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

from traind.config import ENV_PREFIX, ChildConfig, Settings, TrainerConfig
from traind.supervisor.policy import Role

CHILD_TAG = "TRAIND_CHILD_ID"
"""Set in every child's environment; descendants inherit it, which finds escaped ones in /proc."""
OWNER_TAG = "TRAIND_STATE_DIR"
"""Set in every child's environment to its daemon's resolved state_dir: how a restarted daemon
finds in /proc what its killed predecessor left running, and only that."""
DISTRIBUTED_VARS = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
     "MASTER_ADDR", "MASTER_PORT"}
)
SINGLE_NODE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
SECRET_VARS = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
"""The Hub token traind's store may use: the daemon's secret, never a child's."""
RUNTIME_VARS = frozenset({"TRAIND_RESUME_FROM", "TRAIND_HEARTBEAT", CHILD_TAG, OWNER_TAG})


def new_tag(name: str) -> str:
    """A fresh ``CHILD_TAG`` value for one start of child ``name``."""
    return f"{name}-{uuid.uuid4().hex}"


def tag_name(tag: str) -> str:
    """The child name a ``CHILD_TAG`` value was made for (see ``new_tag``)."""
    return tag.rpartition("-")[0]


def owner_of(state_dir: Path) -> str:
    """The ``OWNER_TAG`` value for a daemon of ``state_dir``: its real path, so two spellings
    of one directory match and different directories never do."""
    return str(state_dir.resolve())


def config_variable(name: str) -> bool:
    """Whether ``name`` is one of traind's own configuration overrides, as config.py's
    environment source reads them (case-insensitively): ``TRAIND_<SECTION>`` (a JSON table)
    or ``TRAIND_<SECTION>__<KEY>``. They hold the daemon's secrets (the store's keys), which
    are not the children's business."""
    upper = name.upper()
    if not upper.startswith(ENV_PREFIX):
        return False
    head, nested, _ = upper.removeprefix(ENV_PREFIX).partition("__")
    return bool(nested) or head.lower() in Settings.model_fields


def _dropped(name: str, role: Role) -> bool:
    if name == "NOTIFY_SOCKET" or name.startswith("WATCHDOG_") or name in RUNTIME_VARS:
        return True
    if config_variable(name) or name in SECRET_VARS:
        return True
    distributed = name in DISTRIBUTED_VARS or name.startswith("TORCHELASTIC_")
    return distributed and role is not Role.TRAINER


def child_env(base_env: Mapping[str, str], config: ChildConfig, role: Role) -> dict[str, str]:
    """The environment for a child: ``base_env`` without systemd's, traind's configuration
    (``config_variable``) and (except for the trainer) torch.distributed's variables, GPUs
    pinned by PCI order, then the configured ``env``.

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

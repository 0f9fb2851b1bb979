"""SIGHUP reload: which config changes apply live, and which need a restart.

Storage, retention and status apply without touching the trainer or vLLM; the other
sections describe processes and paths already in use, so a change there is reported and
takes effect at the next start.
"""

from __future__ import annotations

from dataclasses import dataclass

from traind.config import Settings

LIVE = ("storage", "retention", "status")


@dataclass(frozen=True)
class ReloadPlan:
    """The settings to run with now, and what changed."""

    effective: Settings
    applied: tuple[str, ...]
    needs_restart: tuple[str, ...]


def plan_reload(current: Settings, new: Settings) -> ReloadPlan:
    """Merge ``new`` into ``current``: live sections from ``new``, the rest kept as is."""
    changed = [
        name for name in Settings.model_fields if getattr(current, name) != getattr(new, name)
    ]
    applied = tuple(name for name in changed if name in LIVE)
    restart = tuple(name for name in changed if name not in LIVE)
    effective = current.model_copy(update={name: getattr(new, name) for name in applied})
    return ReloadPlan(effective, applied, restart)

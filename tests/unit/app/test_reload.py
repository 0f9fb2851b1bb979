"""Reload planning: live sections apply, the others wait for a restart."""

from __future__ import annotations

from typing import Any

from traind.app.reload import plan_reload
from traind.config import validate

BASE: dict[str, Any] = {
    "run": {"name": "r", "output_dir": "/o"},
    "storage": {"type": "local", "path": "/a"},
    "trainer": {"command": ["python", "train.py"]},
}


def test_nothing_changed() -> None:
    """An identical file changes nothing."""
    plan = plan_reload(validate(BASE), validate(BASE))
    assert plan.applied == ()
    assert plan.needs_restart == ()


def test_storage_and_retention_apply_live() -> None:
    """A storage switch and a retention change are applied at once."""
    new = {**BASE, "storage": {"type": "s3", "bucket": "b"}, "retention": {"keep_last": 2}}
    plan = plan_reload(validate(BASE), validate(new))
    assert plan.applied == ("storage", "retention")
    assert plan.effective.storage.type == "s3"
    assert plan.effective.retention.keep_last == 2


def test_trainer_change_needs_restart_and_is_not_applied() -> None:
    """Trainer and run changes are reported, and the running values are kept."""
    new = {
        **BASE,
        "trainer": {"command": ["python", "other.py"]},
        "run": {"name": "r", "output_dir": "/p"},
    }
    plan = plan_reload(validate(BASE), validate(new))
    assert plan.needs_restart == ("run", "trainer")
    assert plan.effective.trainer is not None
    assert plan.effective.trainer.command == ("python", "train.py")
    assert str(plan.effective.run.output_dir) == "/o"

"""launch.config: the ``[host]`` bound on a followed host that does not answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from traind.launch.config import LaunchConfig


def _config(tmp_path: Path, host: dict[str, Any]) -> LaunchConfig:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "traind.toml").write_text("[run]\nname = 'x'\n")
    return LaunchConfig.model_validate(
        {"name": "u", "backend": "local", "host": host,
         "run": {"code_dir": "code", "traind_config": "traind.toml"}}, context={"base": tmp_path})


def test_unreachable_after_defaults_to_ten_minutes_and_reads_durations(tmp_path: Path) -> None:
    """``[host] unreachable_after`` is 600 s unless set; "90s" is 90 seconds."""
    assert _config(tmp_path, {}).host.unreachable_after == 600.0
    assert _config(tmp_path, {"unreachable_after": "90s"}).host.unreachable_after == 90.0


@pytest.mark.parametrize("value", [0, "0s", -5])
def test_unreachable_after_must_be_positive(tmp_path: Path, value: object) -> None:
    """A bound of 0 or less is refused: it would destroy a host at its first blip."""
    with pytest.raises(ValidationError, match="unreachable_after"):
        _config(tmp_path, {"unreachable_after": value})

"""`traind status` reads the status address from the config file without validating it."""

from __future__ import annotations

from pathlib import Path

import pytest

from traind import config
from traind.status.locate import named


@pytest.fixture
def toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("TRAIND_STATUS", "TRAIND_STATUS__LISTEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "traind.toml"


def test_named_is_the_files_address_else_the_default(toml: Path) -> None:
    """[status] listen when the file has it, the config's default when it has none."""
    toml.write_text('[run]\nname = "x"\n[status]\nlisten = "unix:/run/t.sock"\n')
    assert named(toml) == "unix:/run/t.sock"
    toml.write_text('[run]\nname = "x"\n')
    assert named(toml) == config.StatusConfig().listen


def test_named_follows_the_environment_as_the_config_does(
    toml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRAIND_STATUS__LISTEN wins over the file, in any case, as pydantic-settings reads it."""
    toml.write_text('[status]\nlisten = "127.0.0.1:1"\n')
    monkeypatch.setenv("traind_status__listen", "127.0.0.1:2")
    assert named(toml) == "127.0.0.1:2"
    loaded = config.validate({"run": {"name": "x", "output_dir": "/o"},
                              "storage": {"type": "local", "path": "/s"}})
    assert loaded.status.listen == "127.0.0.1:2"


@pytest.mark.parametrize("text", ["[status", '[status]\nlisten = 9750\n',
                                  '[status]\nlisten = "nowhere"\n', "status = 1\n"])
def test_named_gives_up_on_what_only_validation_can_tell(toml: Path, text: str) -> None:
    """Not TOML, or a listen that is no address: None, so the file gets validated."""
    toml.write_text(text)
    assert named(toml) is None


def test_named_gives_up_on_a_whole_section_from_the_environment(
    toml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRAIND_STATUS as JSON is pydantic-settings' to merge: None."""
    toml.write_text('[status]\nlisten = "127.0.0.1:1"\n')
    monkeypatch.setenv("TRAIND_STATUS", '{"listen": "127.0.0.1:3"}')
    assert named(toml) is None


def test_missing_file_is_none(toml: Path) -> None:
    """No file: None (validation says it is missing)."""
    assert named(toml) is None

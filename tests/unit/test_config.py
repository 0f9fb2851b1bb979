"""Configuration loading: defaults, environment overrides, and one clear error per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from traind import config
from traind.config import LocalStorage
from traind.errors import ConfigError

MINIMAL = """
[run]
name = "exp1"
output_dir = "/data/out"

[storage]
type = "local"
path = "/mnt/ckpt"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "traind.toml"
    path.write_text(text)
    return path


def test_minimal_file_gets_defaults(tmp_path: Path) -> None:
    """A file with only run and storage loads with documented defaults."""
    s = config.load(write(tmp_path, MINIMAL))
    assert isinstance(s.storage, LocalStorage)
    assert s.storage.path == Path("/mnt/ckpt")
    assert s.checkpoints.settle == 5.0
    assert s.checkpoints.markers == ("trainer_state.json", ".metadata")
    assert s.retention.keep_last == 5
    assert s.run.state_dir == Path("/var/lib/traind")
    assert s.trainer is None
    assert s.vllm is None
    assert s.services == ()


def test_example_configs_are_valid() -> None:
    """Every example in config/ loads (each key documented there is real)."""
    examples = sorted(
        p
        for p in Path(__file__).parents[2].joinpath("config").glob("*.toml")
        if p.name != "launch.toml"  # traind launch's own file; checked in test_launch_vast.py
    )
    assert examples
    for path in examples:
        config.load(path)


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRAIND_<SECTION>__<KEY> overrides the file and keeps the other keys."""
    monkeypatch.setenv("TRAIND_RETENTION__KEEP_LAST", "9")
    monkeypatch.setenv("TRAIND_STORAGE__PATH", "/elsewhere")
    s = config.load(write(tmp_path, MINIMAL))
    assert s.retention.keep_last == 9
    assert s.storage.type == "local"
    assert s.storage.path == Path("/elsewhere")


def test_settings_are_frozen(tmp_path: Path) -> None:
    """Config is data: nothing can be written back onto it."""
    s = config.load(write(tmp_path, MINIMAL))
    with pytest.raises(ValueError, match="frozen"):
        s.retention.keep_last = 1  # type: ignore[misc]


def test_every_problem_is_reported_with_key_and_value(tmp_path: Path) -> None:
    """A bad file lists each problem, naming the key, the value and what is allowed."""
    text = MINIMAL.replace('name = "exp1"', 'name = "my run"') + (
        '\n[checkpoints]\nsettle = "5 parsecs"\nsetle = "1s"\n\n[retention]\nkeep_last = 0\n'
    )
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    problems = info.value.problems
    assert len(problems) == 4, problems
    joined = "\n".join(problems)
    assert "run.name = 'my run'" in joined
    assert "checkpoints.settle = '5 parsecs'" in joined
    assert "'30s'" in joined
    assert "checkpoints.setle: unknown key" in joined
    assert "retention.keep_last = 0" in joined


def test_unknown_sections_are_named(tmp_path: Path) -> None:
    """An unknown top-level section is named even when it shares a storage type's name."""
    text = MINIMAL + '\n[ssh]\nhost = "gpu-1"\n\n[s3]\nbucket = "b"\n'
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    assert sorted(info.value.problems) == [
        "s3: unknown key (check the spelling; see config/ for every key)",
        "ssh: unknown key (check the spelling; see config/ for every key)",
    ]


def test_a_launch_file_is_recognised(tmp_path: Path) -> None:
    """Given a ``traind launch`` file, check-config says what it is (not 17 key errors)."""
    text = (Path(__file__).parents[2] / "config" / "launch.toml").read_text()
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("this is a `traind launch` file")


def test_unknown_storage_type(tmp_path: Path) -> None:
    """An unknown backend names the allowed ones."""
    with pytest.raises(ConfigError, match=r"storage.type = 'ftp'.*local, s3, ssh"):
        config.load(write(tmp_path, MINIMAL.replace('"local"', '"ftp"')))


def test_missing_required_keys(tmp_path: Path) -> None:
    """Missing required keys are named one by one."""
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, '[storage]\ntype = "s3"\n'))
    assert "run: required key is missing" in info.value.problems
    assert "storage.bucket: required key is missing" in info.value.problems


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    """Broken TOML and a missing file are config errors that say so."""
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(write(tmp_path, "[run\nname="))
    with pytest.raises(ConfigError, match="not found"):
        config.load(tmp_path / "nope.toml")


def test_config_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    """--config beats $TRAIND_CONFIG, which beats the default path."""
    monkeypatch.delenv("TRAIND_CONFIG", raising=False)
    assert config.config_path(None) == config.DEFAULT_CONFIG
    monkeypatch.setenv("TRAIND_CONFIG", "/x.toml")
    assert config.config_path(None) == Path("/x.toml")
    assert config.config_path("/y.toml") == Path("/y.toml")

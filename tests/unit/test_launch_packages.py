"""What ``traind launch`` installs into the host's venv: traind's requirements from its own
package metadata, plus the extras and packages launch.toml asks for."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from traind.launch.host.packages import select

from traind.errors import ConfigError
from traind.launch.config import InstallSection, load

REQUIRES = [
    "pydantic>=2.7",
    'uvloop>=0.19; sys_platform == "linux"',
    'aiobotocore>=2.13; extra == "s3"',
    'isal>=1.6; extra == "s3"',
    'asyncssh>=2.14; extra == "ssh"',
    'tomli>=2; python_version < "3.11" and extra == "ssh"',
    'torch>=2.2; extra == "train"',
]
CONFIG = Path(__file__).parents[2] / "config" / "launch.toml"


def test_base_and_chosen_extras_without_their_extra_marker() -> None:
    """The base requirements and the chosen extras' are kept, the ``extra ==`` clause dropped
    and any other marker left for pip on the host; other extras are left out."""
    chosen = select(REQUIRES, ["s3", "ssh", "train"], ["S3", "ssh"])
    assert chosen == [
        "pydantic>=2.7", 'uvloop>=0.19; sys_platform == "linux"', "aiobotocore>=2.13",
        "isal>=1.6", "asyncssh>=2.14", 'tomli>=2; python_version < "3.11"',
    ]
    assert select(REQUIRES, ["s3", "ssh", "train"], []) == REQUIRES[:2]


def test_an_extra_traind_does_not_offer_is_named() -> None:
    """Asking for an extra the package does not have is an error naming it and the offered."""
    with pytest.raises(ValueError, match=r"no extra 'gpu' \(it offers: s3, ssh\)"):
        select(REQUIRES, ["s3", "ssh"], ["s3", "gpu"])


def test_default_packages_are_traind_requirements_with_storage_extras() -> None:
    """By default the host gets every requirement of the installed traind (prometheus-client
    included, which traind imports at start) and those of its s3 and ssh extras."""
    dist = metadata.distribution("traind")
    expected = [r.split(";")[0].strip() for r in dist.requires or ()
                if ";" not in r or r.endswith(('extra == "s3"', 'extra == "ssh"'))]
    packages = InstallSection().packages()
    assert packages == expected
    assert any(p.startswith("prometheus-client") for p in packages)
    assert any(p.startswith("aiobotocore") for p in packages)
    assert not any(p.startswith("torch") for p in packages)


def test_example_launch_toml_installs_what_traind_needs() -> None:
    """config/launch.toml (the example, venv = true) installs what traind imports on the host."""
    cfg = load(CONFIG)
    assert cfg.install.venv
    names = [p.split(">")[0].split("=")[0] for p in cfg.install.packages()]
    for name in ("pydantic", "structlog", "aiohttp", "prometheus-client", "asyncssh"):
        assert name in names


def test_unknown_extra_in_launch_toml_is_a_config_problem(tmp_path: Path) -> None:
    """An unknown ``[install] extras`` entry is reported with its key when launch.toml loads."""
    bad = tmp_path / "launch.toml"
    bad.write_text(CONFIG.read_text().replace('extras = ["s3", "ssh"]', 'extras = ["s4"]'))
    with pytest.raises(ConfigError, match=r"install: traind has no extra 's4'"):
        load(bad)

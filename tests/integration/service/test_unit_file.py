"""systemd/traind.service: ``systemd-analyze verify`` accepts it and its settings fit traind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.requires import need_binary

from traind.config import ChildConfig, RunConfig

UNIT = Path(__file__).parents[3] / "systemd" / "traind.service"


def settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file (comments skipped; a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def verify(text: str, tmp_path: Path) -> tuple[int, list[str]]:
    """Run ``systemd-analyze verify`` on ``text`` with ExecStart pointing at the installed
    traind; return its exit code and every complaint about the unit."""
    analyze = need_binary("systemd-analyze")
    traind = shutil.which("traind")
    exec_start = f"{traind} run" if traind else f"{sys.executable} -m traind run"
    lines = [
        f"ExecStart={exec_start} -c /etc/traind/traind.toml" if line.startswith("ExecStart=")
        else line
        for line in text.splitlines()
    ]
    unit = tmp_path / "traind.service"
    unit.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    output = (done.stdout + done.stderr).splitlines()
    return done.returncode, [line for line in output if "traind.service" in line]


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    """The shipped unit verifies without a single warning."""
    code, complaints = verify(UNIT.read_text(), tmp_path)
    assert (code, complaints) == (0, [])


def test_verify_catches_mistakes(tmp_path: Path) -> None:
    """A misspelt key or an unknown Type= is reported, so the check above is not vacuous."""
    broken = UNIT.read_text().replace("KillMode=", "KilMode=").replace(
        "Type=notify\n", "Type=notify-reloadx\n"
    )
    _, complaints = verify(broken, tmp_path)
    assert any("KilMode" in c for c in complaints)
    assert any("notify-reloadx" in c for c in complaints)


def test_unit_settings_fit_the_daemon() -> None:
    """notify + watchdog + SIGHUP reload, mixed kill mode, and a stop timeout longer than
    traind's own grace periods (trainer, uploads, vLLM, services)."""
    unit = settings(UNIT.read_text())
    single = {k: v[-1] for k, v in unit.items()}
    assert single["Type"] == "notify"
    assert single["WatchdogSec"] == "60"
    assert single["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert single["KillMode"] == "mixed"
    assert single["Restart"] == "on-failure"
    grace = ChildConfig.model_fields["stop_grace"].default
    upload = RunConfig.model_fields["stop_timeout"].default
    assert int(single["TimeoutStopSec"]) > 3 * grace + upload
    assert single["ExecStart"].startswith("/usr/local/bin/traind run -c /etc/traind/traind.toml")


@pytest.mark.parametrize("key", ["PrivateDevices", "MemoryDenyWriteExecute", "DevicePolicy"])
def test_hardening_keeps_the_gpu(key: str) -> None:
    """Settings that would hide /dev/nvidia* or break CUDA's JIT are not set."""
    assert key not in settings(UNIT.read_text())


def test_hardening_is_on() -> None:
    """The filesystem is read-only except the state dir and the data paths."""
    unit = {k: v[-1] for k, v in settings(UNIT.read_text()).items()}
    assert unit["NoNewPrivileges"] == "yes"
    assert unit["ProtectSystem"] == "strict"
    assert unit["PrivateTmp"] == "yes"
    assert unit["StateDirectory"] == "traind"
    assert set(unit["ReadWritePaths"].split()) >= {"/var/lib/traind", "/data"}
    assert unit["EnvironmentFile"] == "-/etc/traind/traind.env"

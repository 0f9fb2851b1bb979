"""systemd/traind.service and traind@.service: ``systemd-analyze verify`` accepts them, their
settings fit traind, their hardening spares the GPU, and each instance has its own files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.requires import need_binary

from traind.config import ChildConfig, RunConfig, load

ROOT = Path(__file__).parents[3]
UNIT = ROOT / "systemd" / "traind.service"
TEMPLATE = ROOT / "systemd" / "traind@.service"
BOTH = pytest.mark.parametrize("path", [UNIT, TEMPLATE], ids=["traind", "template"])
# What an instance changes (the rest of the template is traind.service, setting for setting).
PER_INSTANCE = {"Description", "ExecStart", "EnvironmentFile", "Environment",
                "SyslogIdentifier", "StateDirectory", "RuntimeDirectory", "ReadWritePaths"}


def settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file (comments skipped; a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def verify(text: str, tmp_path: Path, name: str = "traind.service") -> tuple[int, list[str]]:
    """Run ``systemd-analyze verify`` on ``text`` saved as ``name`` with ExecStart pointing at
    the installed traind; return its exit code and every complaint about the unit."""
    analyze = need_binary("systemd-analyze")
    traind = shutil.which("traind")
    exec_start = f"{traind} run" if traind else f"{sys.executable} -m traind run"
    lines = [
        f"ExecStart={exec_start} -c /etc/traind/traind.toml" if line.startswith("ExecStart=")
        else line
        for line in text.splitlines()
    ]
    unit = tmp_path / name
    unit.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    output = (done.stdout + done.stderr).splitlines()
    return done.returncode, [line for line in output if name in line]


def exposure(path: Path, tmp_path: Path) -> float:
    """``systemd-analyze security``'s overall exposure of the unit file (0 best, 10 worst)."""
    analyze = need_binary("systemd-analyze")
    unit = tmp_path / path.name.replace("@.", "@a.")
    unit.write_text(path.read_text())
    done = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    """The shipped unit verifies without a single warning."""
    code, complaints = verify(UNIT.read_text(), tmp_path)
    assert (code, complaints) == (0, [])


def test_template_instance_verifies(tmp_path: Path) -> None:
    """An instance of the template unit (traind@grpo.service) verifies without a warning."""
    code, complaints = verify(TEMPLATE.read_text(), tmp_path, "traind@grpo.service")
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


@BOTH
@pytest.mark.parametrize(
    "key", ["PrivateDevices", "MemoryDenyWriteExecute", "DevicePolicy", "DeviceAllow",
            "ProtectClock", "PrivateUsers", "PrivateNetwork"],
)
def test_hardening_keeps_the_gpu(path: Path, key: str) -> None:
    """Settings that would hide /dev/nvidia* (a device list; ProtectClock implies one), break
    CUDA's JIT or cut the network are not set."""
    assert key not in settings(path.read_text())


@BOTH
def test_hardening_spares_what_training_needs(path: Path) -> None:
    """The filters leave NUMA binding (@resources), profilers (@debug), inet, unix and netlink
    sockets and the capabilities CUDA, NCCL and pinned memory use; a filtered call fails with
    EPERM instead of killing the trainer."""
    unit = {k: v[-1] for k, v in settings(path.read_text()).items()}
    assert not {"@resources", "@debug", "@privileged", "@system-service"} & set(
        unit["SystemCallFilter"].lstrip("~").split()
    )
    assert unit["SystemCallFilter"].startswith("~")
    assert unit["SystemCallErrorNumber"] == "EPERM"
    assert set(unit["RestrictAddressFamilies"].split()) >= {
        "AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK",
    }
    dropped = set(unit["CapabilityBoundingSet"].lstrip("~").split())
    assert unit["CapabilityBoundingSet"].startswith("~")
    assert not dropped & {"CAP_IPC_LOCK", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN",
                          "CAP_SYS_PTRACE", "CAP_MKNOD", "CAP_NET_RAW", "CAP_DAC_OVERRIDE",
                          "CAP_KILL"}
    assert unit["LimitMEMLOCK"] == "infinity"


@BOTH
def test_hardening_is_on(path: Path) -> None:
    """The filesystem is read-only except the state dir and the data paths; /data may be
    missing on the host (a leading "-")."""
    unit = {k: v[-1] for k, v in settings(path.read_text()).items()}
    assert unit["NoNewPrivileges"] == "yes"
    assert unit["ProtectSystem"] == "strict"
    assert unit["ProtectHome"] == "read-only"
    assert unit["PrivateTmp"] == "yes"
    state = "/var/lib/" + unit["StateDirectory"]
    assert set(unit["ReadWritePaths"].split()) >= {state, "-/data"}
    assert "/data" not in unit["ReadWritePaths"].split()
    assert "-/etc/traind/traind.env" in settings(path.read_text())["EnvironmentFile"]


@BOTH
def test_exposure_is_lowered(path: Path, tmp_path: Path) -> None:
    """``systemd-analyze security`` rates the unit at most 5.5 (it was 8.3, EXPOSED)."""
    assert exposure(path, tmp_path) <= 5.5


def test_template_is_traind_service_per_instance() -> None:
    """The template has every setting of traind.service, the same, apart from the ones an
    instance changes, so fixing one unit and not the other fails here."""
    common, template = settings(UNIT.read_text()), settings(TEMPLATE.read_text())
    assert set(common) == set(template)
    differ = {k for k in common if common[k] != template[k]}
    assert differ <= PER_INSTANCE
    assert template["ExecStart"] == ["/usr/local/bin/traind run -c /etc/traind/%i.toml"]
    assert template["EnvironmentFile"] == ["-/etc/traind/traind.env", "-/etc/traind/%i.env"]


def instance(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """What traind reads as instance ``name`` of the template: its config path, the
    directories systemd makes, and the settings traind loads with the unit's environment."""
    unit = {k: [v.replace("%i", name) for v in vs] for k, vs in settings(
        TEMPLATE.read_text()).items()}
    for assignment in unit["Environment"]:
        key, value = assignment.strip('"').split("=", 1)
        monkeypatch.setenv(key, value)
    config = tmp_path / f"{name}.toml"
    example = (ROOT / "config" / "local.toml").read_text()
    config.write_text(example.replace('"/data/', f'"/data/{name}/'))
    loaded = load(config)
    return {
        "config": unit["ExecStart"][0].rsplit(" ", 1)[1],
        "state": "/var/lib/" + unit["StateDirectory"][0],
        "runtime": "/run/" + unit["RuntimeDirectory"][0],
        "state_dir": str(loaded.run.state_dir),
        "listen": loaded.status.listen,
        "ident": unit["SyslogIdentifier"][0],
    }


def test_two_instances_share_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two instances read their own config, and traind (with the unit's environment over the
    same example file) uses each one's own state directory and status socket, the ones
    systemd creates for it, so two runs can share a host."""
    a = instance("grpo", tmp_path, monkeypatch)
    b = instance("sft", tmp_path, monkeypatch)
    assert a == {
        "config": "/etc/traind/grpo.toml", "state": "/var/lib/traind-grpo",
        "runtime": "/run/traind-grpo", "state_dir": "/var/lib/traind-grpo",
        "listen": "unix:/run/traind-grpo/status.sock", "ident": "traind@grpo",
    }
    assert all(a[k] != b[k] for k in a)


def test_dedicated_user_drop_in_from_the_readme(tmp_path: Path) -> None:
    """The drop-in systemd/README.md gives for running as a dedicated user verifies with the
    unit and lowers its exposure further (to at most 3.5)."""
    readme = (ROOT / "systemd" / "README.md").read_text()
    block = readme.split("# [Service]\n", 1)[1].split("systemctl restart", 1)[0]
    drop_in = [line.removeprefix("# ") for line in block.splitlines()
               if line.startswith("# ") and not line.startswith("# #")]
    assert "User=traind" in drop_in
    text = UNIT.read_text().replace("[Service]\n", "[Service]\n" + "\n".join(drop_in) + "\n")
    code, complaints = verify(text, tmp_path)
    assert (code, complaints) == (0, [])
    combined = tmp_path / "dedicated" / "traind.service"
    combined.parent.mkdir()
    combined.write_text(text)
    assert exposure(combined, tmp_path) <= 3.5

"""Set-up as a new user meets it: the README's two commands on a fresh clone with no
environment yet, the demo's report when traind fails, what a missing system program does to
the set-up and to a test that needs it, and systemd/README.md's install of the program."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tests.support.requires import missing

ROOT = Path(__file__).parents[2]
INSIDE = "TRAIND_SETUP_TEST_INSIDE"
"""Set for the commands a test here runs, so the suite they start never starts them again."""


def readme_command(intro: str) -> str:
    """The README's command in the first ```bash block after the paragraph starting ``intro``."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf"^{re.escape(intro)}.*?```bash\n(.*?)```", text, re.S | re.M)
    assert found, f"no bash block after {intro!r} in README.md"
    return found[1].strip()


DEMO = readme_command("Run the demo")
TESTS = readme_command("Run the test suite")


def fresh_env(**extra: str) -> dict[str, str]:
    """This environment without any Python environment of ours: no PYTHONPATH, no active venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRAIND_VENV", "PYTHONHOME")}
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if p != f"{venv}/bin"
        )
    return {**env, INSIDE: "1", **extra}


def fresh_clone(dest: Path) -> Path:
    """What a clone of this checkout has (its tracked and new, not ignored, files), at ``dest``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        missing("a git checkout of traind (and git) to clone from")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True, timeout=60,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    return dest


def run(command: str, cwd: Path, env: dict[str, str], timeout: float) -> tuple[str, float]:
    """Run a README command with bash; its output, and how long it took. Fails on non-zero."""
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{output[-4000:]}"
    return output, time.monotonic() - started


@pytest.mark.timeout(1500)
def test_readme_commands_set_up_a_fresh_clone(tmp_path: Path) -> None:
    """On a fresh clone with no .venv, the README's demo command creates the project's own
    environment and runs the demo to its listing; the README's test command then adds the
    test tools to it and runs ruff, mypy and pytest (on one small test file here)."""
    if os.environ.get(INSIDE):
        pytest.skip("already inside the README commands' own run")
    clone = fresh_clone(tmp_path / "clone")
    try:
        env = fresh_env()
        out, demo_fresh = run(DEMO, clone, env, timeout=900)
        assert f"creating {clone}/.venv" in out
        assert "committed checkpoints now in the store" in out
        assert re.search(r"^checkpoint-8 +8 ", out, re.M), out[-2000:]
        out, demo_warm = run(DEMO, clone, env, timeout=300)
        assert "installing" not in out, "a second run must reuse .venv as it is"
        out, tests_fresh = run(f"{TESTS} tests/unit/util/test_units.py", clone, env, timeout=900)
        assert "All checks passed!" in out
        assert "Success: no issues found" in out
        assert re.search(r"\d+ passed", out), out[-2000:]
        venv_python = clone / ".venv/bin/python"
        assert subprocess.run([str(venv_python), "-c", "import traind, trl, pytest, asyncssh"],
                              timeout=120, check=False).returncode == 0
        print(f"\nwall times: demo fresh {demo_fresh:.0f}s, warm {demo_warm:.0f}s; "
              f"test command (set-up + ruff + mypy + one file) after the demo {tests_fresh:.0f}s")
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def test_demo_shows_traind_log_when_traind_fails(tmp_path: Path) -> None:
    """When traind run fails, the demo says so and prints the end of traind's log (here: the
    config problem an environment override makes), exiting non-zero."""
    env = fresh_env(DEMO_DIR=str(tmp_path / "demo"), TRAIND_RETENTION__KEEP_LAST="lots")
    done = subprocess.run(["bash", str(ROOT / "demo/run.sh")], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "traind run failed; the end of its log" in done.stderr
    assert "retention.keep_last" in done.stderr
    assert "TRAIND_RETENTION__KEEP_LAST" in done.stderr


def path_without(tool: str, into: Path) -> str:
    """$PATH with every directory holding ``tool`` replaced by a copy of links to the rest."""
    dirs = []
    for number, entry in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        where = Path(entry)
        if not (where / tool).exists():
            dirs.append(entry)
            continue
        copy = into / str(number)
        copy.mkdir(parents=True)
        for item in where.iterdir():
            if item.name != tool:
                (copy / item.name).symlink_to(item)
        dirs.append(str(copy))
    return os.pathsep.join(dirs)


NEEDS = {
    "rsync": "tests/integration/launch/test_launch_ssh.py"
             "::test_local_launch_follows_to_the_end_then_downs",
    "ssh-keygen": "tests/integration/launch/test_launch_vast.py"
                  "::test_instance_host_key_is_trusted_on_first_use_then_pinned",
}
"""A system program, and a test that needs it."""


@pytest.mark.parametrize("tool", sorted(NEEDS))
@pytest.mark.parametrize(("ci", "outcome"), [("", "1 skipped"), ("true", "1 failed")])
def test_a_missing_system_program_is_named_not_a_crash(
    tmp_path: Path, tool: str, ci: str, outcome: str
) -> None:
    """A test on a machine without the system program it needs (rsync for a launch, ssh-keygen
    for an sshd) is skipped locally and fails under CI, both naming the program, instead of
    failing somewhere inside."""
    env = {**os.environ, "PATH": path_without(tool, tmp_path / "bin"), "CI": ci, INSIDE: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", NEEDS[tool], "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert outcome in done.stdout, done.stdout[-3000:]
    assert f"executable {tool!r} is not on PATH" in done.stdout


def service_install_step(way: str) -> str:
    """systemd/README.md's way to put the program in place: step 1 of its install block
    ("checkout"), or the block that builds and installs a wheel ("wheel")."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "systemd/README.md").read_text(), re.S)
    if way == "checkout":
        return next(b for b in blocks if b.startswith("# 1.")).split("\n# 2.")[0]
    return next(b for b in blocks if "pip wheel" in b)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("way", ["checkout", "wheel"])
def test_service_install_steps_work_as_written(tmp_path: Path, way: str) -> None:
    """systemd/README.md's install of the program (from a checkout, or from a wheel built in
    one) works as written: traind and its s3 and ssh extras land in a virtualenv of their own,
    its console script where the unit runs it (both paths moved under a temporary dir here)."""
    if os.environ.get(INSIDE):
        pytest.skip("already inside the README commands' own run")
    clone = fresh_clone(tmp_path / "clone")
    script = (service_install_step(way).replace("/opt/traind", f"{tmp_path}/opt/traind")
              .replace("/usr/local/bin", f"{tmp_path}/bin")
              .replace("/tmp/traind-build", f"{tmp_path}/build"))
    (tmp_path / "bin").mkdir()
    run(f"set -e\n{script}", clone, fresh_env(), timeout=600)
    shutil.rmtree(clone)  # what is installed must not need the checkout any more
    done = subprocess.run([str(tmp_path / "bin/traind"), "check-config", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    python = tmp_path / "opt/traind/bin/python"
    done = subprocess.run([str(python), "-c", "import aiobotocore, asyncssh, traind.cli"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_test_command_names_system_packages_it_cannot_install() -> None:
    """Not root, the test command's set-up names the missing system packages and the apt-get
    line that installs them, and carries on (their tests skip, or fail under CI)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        missing("setpriv (util-linux) and root, to run the set-up as another user")
    with tempfile.TemporaryDirectory() as bin_dir:  # not under tmp_path: the user must read it
        os.chmod(bin_dir, 0o755)
        # A copy the user can read: the checkout may be in root's 0700 home.
        script = shutil.copy(ROOT / "tests/support/venv.sh", Path(bin_dir) / "venv.sh")
        os.chmod(script, 0o644)
        done = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c",
             f"source {script} && system_tools && echo carried on"],
            cwd="/", capture_output=True, text=True, timeout=60, check=False,
            env={**fresh_env(), "PATH": path_without("rsync", Path(bin_dir))},
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("NOT INSTALLED (system packages, needs root): rsync\n"), (
        done.stderr
    )
    assert "sudo apt-get install rsync\n" in done.stderr
    assert done.stdout.strip() == "carried on"

"""The multi-node examples in examples/multinode/ work as shipped: each traind config loads
with traind's own loader, takes its node rank from the variable its scheduler sets and runs
the job's torchrun as its [trainer], whose command expands the scheduler's variables and the
resume point traind passes; the scheduler's node count is run.nodes, the YAML parses and every
shell script passes ``bash -n``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.requires import need_binary, need_module

from traind import config
from traind.config import Settings
from traind.supervisor.env import child_env
from traind.supervisor.policy import Role
from traind.supervisor.trainer import resume_argv
from traind.util import nodes

EXAMPLES = Path(__file__).parents[2] / "examples" / "multinode"


@dataclass(frozen=True)
class Example:
    """One scheduler's example: its traind config, its shell scripts, its node count, the
    variable its rank comes from, and the others the trainer command reads, as set on the
    last node (``exported``: set by the example's own script rather than the scheduler)."""

    toml: str
    scripts: list[str]
    count: int
    variable: str
    scheduler_env: dict[str, str]
    exported: tuple[str, ...] = ()


def yaml_docs(name: str) -> list[Any]:
    """The YAML documents of ``name`` (pyyaml: skip locally without it, fail under CI)."""
    need_module("yaml")
    import yaml

    return list(yaml.safe_load_all((EXAMPLES / name).read_text()))


def skypilot() -> Example:
    task = yaml_docs("skypilot.yaml")[0]
    count = int(task["num_nodes"])
    return Example((EXAMPLES / "skypilot-traind.toml").read_text(), [task["setup"], task["run"]],
                   count, "SKYPILOT_NODE_RANK",
                   {"SKYPILOT_NUM_NODES": str(count), "SKYPILOT_NUM_GPUS_PER_NODE": "8",
                    "SKYPILOT_NODE_IPS": "\n".join(f"10.0.0.{i + 1}" for i in range(count))})


def slurm() -> Example:
    script = (EXAMPLES / "slurm.sbatch").read_text()
    found = re.search(r"^#SBATCH --nodes=(\d+)$", script, re.M)
    assert found, "slurm.sbatch sets no #SBATCH --nodes"
    count = int(found[1])
    return Example((EXAMPLES / "slurm-traind.toml").read_text(), [script], count,
                   "SLURM_NODEID", {"SLURM_NNODES": str(count), "MASTER_ADDR": "gpu001"},
                   exported=("MASTER_ADDR",))


def kubernetes() -> Example:
    docs = {doc["kind"]: doc for doc in yaml_docs("kubernetes.yaml")}
    job = docs["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"]
    pod = job["template"]["spec"]
    containers = pod.get("initContainers", []) + pod["containers"]
    scripts = [c["command"][2] for c in containers if c["command"][:2] == ["bash", "-c"]]
    assert any(c["command"][:2] == ["traind", "run"] for c in pod["containers"])
    return Example(docs["ConfigMap"]["data"]["traind.toml"], scripts, int(job["completions"]),
                   "JOB_COMPLETION_INDEX", {})


EXAMPLE_SETS = {"skypilot": skypilot, "slurm": slurm, "kubernetes": kubernetes}


def loaded(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Example, Settings]:
    """The example and its config as traind loads it on the last node (only its scheduler's
    rank variable set)."""
    example = EXAMPLE_SETS[name]()
    for other in nodes.RANK_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(example.variable, str(example.count - 1))
    return example, config.validate(tomllib.loads(example.toml), f"{name} example")


def trainer_script(settings: Settings) -> str | None:
    """The shell script of a ``["bash", "-c", SCRIPT]`` trainer command, else None."""
    assert settings.trainer is not None
    command = settings.trainer.command
    return command[2] if command[:2] == ("bash", "-c") and len(command) == 3 else None


@pytest.mark.parametrize("name", sorted(EXAMPLE_SETS))
def test_each_example_config_loads_and_takes_its_rank_from_its_scheduler(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's traind config loads with traind's loader, has run.nodes equal to the
    scheduler's node count and no fixed node_rank, and takes the rank from the variable
    its scheduler sets, which nodes.py reads and the example's trainer command uses."""
    example, settings = loaded(name, monkeypatch)
    assert example.variable in nodes.RANK_VARIABLES
    assert settings.run.node_rank is None
    assert settings.run.nodes == example.count > 1
    assert config.node_rank(settings) == nodes.NodeRank(
        example.count - 1, example.count, f"${example.variable}")
    assert settings.trainer is not None
    assert example.variable in " ".join(settings.trainer.command)


@pytest.mark.parametrize("name", sorted(EXAMPLE_SETS))
def test_each_example_lets_traind_start_the_trainer_and_pick_the_resume_point(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """traind starts torchrun itself ([trainer], exit_when_done, restore on) so the hosts
    agree on the resume point: no example pulls a tag or pins one (RESUME_TAG), and no
    script starts torchrun beside traind."""
    example, settings = loaded(name, monkeypatch)
    assert settings.trainer is not None
    assert settings.trainer.exit_when_done
    assert settings.run.restore
    assert "torchrun" in " ".join(settings.trainer.command)
    for text in [example.toml, *example.scripts]:
        assert "traind pull" not in text
        assert "RESUME_TAG" not in text
    for script in example.scripts:
        code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
        assert not any("torchrun" in line.split(" #")[0] for line in code), script
    for variable in example.exported:
        assert any(f"export {variable}=" in s for s in example.scripts), variable


@pytest.mark.parametrize("resume", [None, "/ckpt/checkpoint-7"])
@pytest.mark.parametrize("name", sorted(EXAMPLE_SETS))
def test_each_example_trainer_command_expands_to_this_nodes_torchrun(
    name: str, resume: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The trainer command, run as traind runs it (its argv with {resume_from} filled in, the
    environment traind gives a trainer, $TRAIND_RESUME_FROM when resuming) against a
    torchrun that prints its argv, becomes this node's torchrun: --nnodes = run.nodes, the
    last node's --node-rank, a master address, run.output_dir, and the resume flag exactly
    when there is a checkpoint."""
    bash = need_binary("bash")
    example, settings = loaded(name, monkeypatch)
    assert settings.trainer is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "torchrun"
    stand_in.write_text(f"#!{bash}\nexec {sys.executable} -c "
                        "'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    stand_in.chmod(0o755)
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", example.variable: str(example.count - 1),
            **example.scheduler_env}
    env = child_env(base, settings.trainer, Role.TRAINER)
    if resume:
        env["TRAIND_RESUME_FROM"] = resume
    argv = resume_argv(settings.trainer.command, Path(resume) if resume else None)
    ran = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    args = json.loads(ran.stdout)
    flags = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
    assert flags["--nnodes"] == str(settings.run.nodes)
    assert flags["--node-rank"] == str(example.count - 1)
    for flag in ("--master-addr", "--nproc-per-node", "--master-port"):
        assert flags[flag], flag
    assert args[args.index("--output_dir") + 1] == str(settings.run.output_dir)
    if resume:
        assert args[args.index("--resume_from_checkpoint") + 1] == resume
    else:
        assert "--resume_from_checkpoint" not in args
    script = trainer_script(settings)
    assert script is None or "{resume_from}" not in script


@pytest.mark.parametrize("name", sorted(EXAMPLE_SETS))
def test_each_example_shell_script_parses(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shell script of the example (the sbatch file, SkyPilot's setup and run, the
    pod's bash -c commands, a bash -c trainer command) passes bash -n."""
    bash = need_binary("bash")
    example, settings = loaded(name, monkeypatch)
    scripts = example.scripts + [s for s in [trainer_script(settings)] if s is not None]
    assert scripts
    for script in scripts:
        checked = subprocess.run([bash, "-n"], input=script, capture_output=True, text=True,
                                 timeout=30)
        assert checked.returncode == 0, f"{name}: {checked.stderr}"


def test_the_examples_are_the_ones_docs_show() -> None:
    """docs/multinode.md names every file in examples/multinode/, so none is left unexplained."""
    doc = (Path(__file__).parents[2] / "docs" / "multinode.md").read_text()
    for path in EXAMPLES.iterdir():
        assert f"examples/multinode/{path.name}" in doc, path.name

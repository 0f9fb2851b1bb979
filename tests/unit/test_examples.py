"""The multi-node examples in examples/multinode/ work as shipped: each traind config loads
with traind's own loader and takes its node rank from the variable its scheduler sets, the
scheduler's node count is run.nodes, the YAML parses and every shell script passes
``bash -n``."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from tests.support.requires import need_binary, need_module

from traind import config, nodes

EXAMPLES = Path(__file__).parents[2] / "examples" / "multinode"


def yaml_docs(name: str) -> list[Any]:
    """The YAML documents of ``name`` (pyyaml: skip locally without it, fail under CI)."""
    need_module("yaml")
    import yaml

    return list(yaml.safe_load_all((EXAMPLES / name).read_text()))


def skypilot() -> tuple[str, list[str], int]:
    task = yaml_docs("skypilot.yaml")[0]
    return (EXAMPLES / "skypilot-traind.toml").read_text(), [task["setup"], task["run"]], int(
        task["num_nodes"])


def slurm() -> tuple[str, list[str], int]:
    script = (EXAMPLES / "slurm.sbatch").read_text()
    found = re.search(r"^#SBATCH --nodes=(\d+)$", script, re.M)
    assert found, "slurm.sbatch sets no #SBATCH --nodes"
    return (EXAMPLES / "slurm-traind.toml").read_text(), [script], int(found[1])


def kubernetes() -> tuple[str, list[str], int]:
    docs = {doc["kind"]: doc for doc in yaml_docs("kubernetes.yaml")}
    job = docs["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"]
    pod = job["template"]["spec"]
    scripts = [c["command"][2] for c in pod["initContainers"] + pod["containers"]
               if c["command"][:2] == ["bash", "-c"]]
    return docs["ConfigMap"]["data"]["traind.toml"], scripts, int(job["completions"])


EXAMPLE_SETS = {"skypilot": (skypilot, "SKYPILOT_NODE_RANK"),
                "slurm": (slurm, "SLURM_NODEID"),
                "kubernetes": (kubernetes, "JOB_COMPLETION_INDEX")}


@pytest.mark.parametrize("name", sorted(EXAMPLE_SETS))
def test_each_example_config_loads_and_takes_its_rank_from_its_scheduler(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's traind config loads with traind's loader, has run.nodes equal to the
    scheduler's node count and no fixed node_rank, and takes the rank from the variable
    its scheduler sets, which nodes.py reads and the example's scripts use."""
    read, variable = EXAMPLE_SETS[name]
    toml, scripts, count = read()
    assert variable in nodes.RANK_VARIABLES
    assert any(variable in script for script in scripts)
    for other in nodes.RANK_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, str(count - 1))
    settings = config.validate(tomllib.loads(toml), f"{name} example")
    assert settings.run.node_rank is None
    assert settings.run.nodes == count > 1
    assert config.node_rank(settings) == nodes.NodeRank(count - 1, count, f"${variable}")


@pytest.mark.parametrize("name", sorted(EXAMPLE_SETS))
def test_each_example_shell_script_parses(name: str) -> None:
    """Every shell script of the example (the sbatch file, SkyPilot's setup and run, the
    pod's bash -c commands) passes bash -n."""
    bash = need_binary("bash")
    _, scripts, _ = EXAMPLE_SETS[name][0]()
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

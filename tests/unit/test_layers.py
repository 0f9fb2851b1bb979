"""Imports run downward only, in DESIGN.md's layers: cli → app / launch → checkpoints /
supervisor / status / integrations → protocol → storage → config → layout → util → errors.

Packages on one layer are peers and do not import each other; a module may import its own
package and any layer below. Imports under ``TYPE_CHECKING`` count too: a type that needs an
upward import is in the wrong layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import traind

PACKAGE = Path(traind.__file__).parent

LAYERS: list[set[str]] = [
    {"errors"},
    {"util"},
    {"layout"},
    {"config"},
    {"storage"},
    {"protocol"},
    {"checkpoints", "supervisor", "status", "integrations"},
    {"app", "launch"},
    {"cli"},
    {"__main__"},
]
"""Lowest first. ``traind`` itself (``__version__``) is below all of them."""

RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str | None:
    """``traind.checkpoints.commit.streamer`` → ``checkpoints``; ``traind`` itself → None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "traind" else None


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """Every ``traind`` module that ``path`` imports, with the line it does so on."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("traind")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            if base == "traind":  # from traind import config → traind.config
                found += [(node.lineno, f"traind.{a.name}") for a in node.names]
            elif base.startswith("traind."):
                found.append((node.lineno, base))
    return found


def modules() -> list[tuple[Path, str]]:
    """Every module of the package, with its dotted name."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.append((path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    return found


def test_every_package_has_a_layer() -> None:
    units = {u for _, m in modules() if (u := unit_of(m)) is not None}
    assert units - RANK.keys() == set(), "a new package needs its layer in LAYERS and DESIGN.md"


def test_imports_run_downward_only() -> None:
    against = []
    for path, module in modules():
        here = unit_of(module)
        if here is None:
            continue
        for line, target in imports(path, module):
            there = unit_of(target)
            if there is None or there == here or there not in RANK:
                continue
            if RANK[there] >= RANK[here]:
                against.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}: "
                               f"{here} (layer {RANK[here]}) may not import {there} "
                               f"(layer {RANK[there]})")
    assert against == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an upward import, a peer import and a relative one are found."""
    module = tmp_path / "m.py"
    module.write_text("from traind.app.daemon import Daemon\nfrom . import streamer\n"
                      "from traind import cli\n")
    found = [t for _, t in imports(module, "traind.storage.m")]
    assert found == ["traind.app.daemon", "traind.storage", "traind.cli"]
    assert RANK["app"] > RANK["storage"]
    assert RANK["status"] == RANK["supervisor"]

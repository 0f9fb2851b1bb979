"""The tree stays one a newcomer can find their way in: no package holds more than 15
modules (group them into sub-packages by what they do), and no two test files share a name
(the one for a module is found by its name alone)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import traind

PACKAGE = Path(traind.__file__).parent
TESTS = Path(__file__).parents[1]
MOST_MODULES = 15


def test_no_package_holds_more_than_15_modules() -> None:
    crowded = {}
    for init in PACKAGE.rglob("__init__.py"):
        modules = [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MOST_MODULES:
            crowded[str(init.parent.relative_to(PACKAGE.parent))] = len(modules)
    assert crowded == {}, "split these into sub-packages by what they do"


def test_no_two_test_files_share_a_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    shared = {name: sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob(name))
              for name, n in names.items() if n > 1}
    assert shared == {}

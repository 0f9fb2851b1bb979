"""Every error traind raises is under TraindError, and errors.py draws the whole tree."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import traind
from traind import errors
from traind.errors import TraindError


def defined_errors() -> dict[str, type[BaseException]]:
    """Every exception class defined in a traind module, by name (private ones left out)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(traind.__path__, "traind."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == module.__name__ and not name.startswith("_")):
                found[name] = value
    return found


def drawn() -> dict[str, tuple[str, str]]:
    """The tree in errors.py's docstring: name → (parent name, module)."""
    tree: dict[str, tuple[str, str]] = {}
    parents: list[str] = []
    for line in (errors.__doc__ or "").split("::", 1)[1].splitlines():
        match = re.match(r"^(?P<lead>[ │├└─]*)(?P<name>\w+)(?:  \[(?P<module>[\w.]+)\])?$",
                         line.strip("\n")[4:])
        if not match:
            continue
        depth = len(match["lead"]) // 4
        del parents[depth:]
        tree[match["name"]] = (parents[-1] if parents else "", match["module"] or "errors")
        parents.append(match["name"])
    return tree


def test_every_error_is_under_the_root() -> None:
    """No exception class of traind stands outside TraindError."""
    strays = sorted(n for n, c in defined_errors().items() if not issubclass(c, TraindError))
    assert strays == []


def test_errors_py_draws_the_tree_as_the_code_has_it() -> None:
    """Each error is drawn once, under its real parent, with the module that defines it."""
    code = {
        name: (cls.__mro__[1].__name__ if cls is not TraindError else "",
               cls.__module__.removeprefix("traind."))
        for name, cls in defined_errors().items()
    }
    assert drawn() == code

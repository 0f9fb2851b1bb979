"""docs/events.md lists every log event the code emits, with its level and fields, and no other."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "daemon" / "traind"
CATALOGUE = ROOT / "docs" / "events.md"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
ROW = re.compile(r"^\|\s*`([a-z0-9_]+)`\s*\|([^|]*)\|([^|]*)\|([^|]*)\|\s*$")


@dataclass
class Event:
    """What the code or the catalogue says about one event name."""

    levels: set[str] = field(default_factory=set)
    fields: set[str] = field(default_factory=set)
    where: set[str] = field(default_factory=set)


def _levels(func: ast.expr) -> set[str]:
    """The levels a call's target logs at: ``log.info``, or ``(log.error if x else log.info)``."""
    if isinstance(func, ast.Attribute) and func.attr in LEVELS:
        return {"error" if func.attr == "exception" else func.attr}
    if isinstance(func, ast.IfExp):
        body, orelse = _levels(func.body), _levels(func.orelse)
        return body | orelse if body and orelse else set()
    return set()


def emitted(root: Path = PACKAGE) -> dict[str, Event]:
    """Every event logged under ``root``: calls whose target is a log level and whose first
    argument is a literal name, with the levels and keyword fields used."""
    found: dict[str, Event] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not (levels := _levels(node.func)):
                continue
            if not node.args or not isinstance(name := node.args[0], ast.Constant):
                continue
            if not isinstance(name.value, str):
                continue
            event = found.setdefault(name.value, Event())
            event.levels |= levels
            event.fields |= {k.arg for k in node.keywords if k.arg is not None}
            event.where.add(f"{path.relative_to(root)}:{node.lineno}")
    return found


def documented(text: str) -> dict[str, Event]:
    """Every row of the catalogue's tables: `name` | levels | `fields` | meaning."""
    rows: dict[str, Event] = {}
    for line in text.splitlines():
        if (m := ROW.match(line)) is None:
            continue
        name, levels, fields, meaning = m.groups()
        assert name not in rows, f"{name} is documented twice"
        assert meaning.strip(), f"{name} has no meaning line"
        rows[name] = Event(
            levels={lv.strip() for lv in levels.split(",") if lv.strip()},
            fields={f for part in re.findall(r"`([^`]+)`", fields) for f in part.split("/")},
        )
    return rows


def test_every_emitted_event_is_documented() -> None:
    """An event the code logs has a catalogue row (add one when adding an event)."""
    missing = {n: sorted(e.where) for n, e in emitted().items() if n not in documented(
        CATALOGUE.read_text())}
    assert missing == {}


def test_every_documented_event_is_emitted() -> None:
    """A catalogue row names an event the code still logs (remove it with the event)."""
    gone = documented(CATALOGUE.read_text()).keys() - emitted().keys()
    assert gone == set()


def test_levels_and_fields_match() -> None:
    """Each event's documented levels are the levels it is logged at, and every field the
    code passes by name is documented."""
    docs = documented(CATALOGUE.read_text())
    wrong = {}
    for name, event in emitted().items():
        if name not in docs:
            continue
        doc = docs[name]
        if doc.levels != event.levels or event.fields - doc.fields:
            wrong[name] = (sorted(event.levels), sorted(event.fields - doc.fields))
    assert wrong == {}


def test_the_scan_finds_what_it_must(tmp_path: Path) -> None:
    """The scanner sees plain, bound and conditional-level calls, so the checks above are not
    vacuous, and ignores calls that log nothing."""
    (tmp_path / "m.py").write_text(
        "log.info('plain_event', tag=t)\n"
        "self._log.warning(\n    'bound_event', **facts, pid=1)\n"
        "(log.error if failed else log.info)('either_event')\n"
        "task.exception()\n"
        "logging.info(message)\n"
    )
    found = emitted(tmp_path)
    assert set(found) == {"plain_event", "bound_event", "either_event"}
    assert found["bound_event"].fields == {"pid"}
    assert found["either_event"].levels == {"error", "info"}
    rows = documented("| `a_b` | info, error | `x`, `y/z` | it. |\n| event | level | f | m |")
    assert rows["a_b"].levels == {"info", "error"}
    assert rows["a_b"].fields == {"x", "y", "z"}

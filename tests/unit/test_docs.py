"""docs/ is kept in step with the code: every config key is on its page and no page names a
key that does not exist, docs/architecture.md names every package and module and no other,
docs/cli.md is what the parser says, and every page is reachable from the README and the index."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel
from tests.support import cli_reference

import traind
from traind.cli import build_parser
from traind.config import Settings
from traind.launch.config import LaunchConfig

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
PACKAGE = Path(traind.__file__).parent


def models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X | None``, ``tuple[X, ...]``, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def model_keys(model: type[BaseModel], section: str = "") -> set[str]:
    """Every leaf key under ``model`` as ``section.key``; a ``[storage]`` member's keys as
    ``storage/<type>.key``, since each store type has keys of its own."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        name = field.alias or name
        inner = models_in(field.annotation)
        if not inner:
            keys.add(f"{section}.{name}" if section else name)
        for sub in inner:
            where = f"{section}.{name}" if section else name
            if "type" in sub.model_fields and len(inner) > 1:
                kind = typing.get_args(sub.model_fields["type"].annotation)[0]
                where = f"{where}/{kind}"
            keys |= model_keys(sub, where)
    return keys


def documented_keys(page: Path) -> set[str]:
    """The keys a page's tables name, as ``section.key``: a level-3 heading names the sections
    its tables apply to (```[run]```, ```[[services]]```, ```[storage]``` with
    ```type = "s3"```; "Top-level keys" for none), and in a table headed ``| key |`` each
    row's first cell is a key."""
    keys: set[str] = set()
    sections: list[str] = []
    in_table = False  # inside a table whose header is "| key | ..."
    for line in page.read_text().splitlines():
        in_table = line.startswith("| key |") or (in_table and line.startswith("|"))
        if line.startswith("#"):
            sections = []
        if line.startswith("### "):
            named = re.findall(r"`\[\[?([a-z_.]+)\]\]?`", line)
            kind = re.search(r'`type = "(\w+)"`', line)
            sections = [f"{s}/{kind[1]}" if kind else s for s in named]
            if "Top-level keys" in line:
                sections = [""]
        row = re.match(r"\| `([a-z_]+)` \|", line)
        if in_table and row:
            assert sections, f"{page.name}: a key row outside a keyed section: {line}"
            keys |= {f"{s}.{row[1]}" if s else row[1] for s in sections}
    return keys


def assert_same(page: Path, documented: set[str], real: set[str]) -> None:
    missing, unknown = sorted(real - documented), sorted(documented - real)
    assert not missing, f"{page.relative_to(ROOT)}: keys missing from the page: {missing}"
    assert not unknown, f"{page.relative_to(ROOT)}: keys that do not exist: {unknown}"


def test_configuration_page_names_every_key_of_traind_toml() -> None:
    """docs/configuration.md has a row for every key of the config models, and no other."""
    page = DOCS / "configuration.md"
    assert_same(page, documented_keys(page), model_keys(Settings))


def test_launch_page_names_every_key_of_launch_toml() -> None:
    """docs/launch.md has a row for every key of launch.toml's models, and no other."""
    page = DOCS / "launch.md"
    assert_same(page, documented_keys(page), model_keys(LaunchConfig))


def real_modules() -> set[str]:
    """Every package (``storage/s3/``) and module (``storage/s3/store.py``) of traind, as
    paths under daemon/traind; a subpackage's ``__init__.py`` is the package (``traind``'s
    own is ``__init__.py``)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if "__pycache__" in rel.parts:
            continue
        if path.name == "__init__.py" and rel.parent != Path("."):
            found.add(f"{rel.parent.as_posix()}/")
        else:
            found.add(rel.as_posix())
    return found


def architecture_modules(text: str) -> set[str]:
    """The modules and packages docs/architecture.md lists under "## Modules": the first
    code span of each list item (``- `storage/s3/` ...``)."""
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\s*- `([\w/]+(?:\.py|/))`", section, re.M))


def test_architecture_names_every_module() -> None:
    """docs/architecture.md has a line for every package and module of traind, and none for
    one that does not exist."""
    page = DOCS / "architecture.md"
    listed, real = architecture_modules(page.read_text()), real_modules()
    missing, unknown = sorted(real - listed), sorted(listed - real)
    assert not missing, f"docs/architecture.md: modules missing: {missing}"
    assert not unknown, f"docs/architecture.md: modules that do not exist: {unknown}"


def test_cli_reference_is_the_parser() -> None:
    """docs/cli.md is what the argparse parsers of traind and traind launch say, option for
    option (regenerate it with ``python -m tests.support.cli_reference > docs/cli.md``)."""
    written = (DOCS / "cli.md").read_text()
    assert written == cli_reference.render(build_parser()), (
        "docs/cli.md is out of step with the parser: "
        "python -m tests.support.cli_reference > docs/cli.md"
    )


def linked(page: Path) -> set[Path]:
    """The files a page links to, resolved."""
    return {target for target, _ in links(page)}


def links(page: Path) -> list[tuple[Path, str]]:
    """Each relative link of a page: the file, resolved, and the anchor (``""`` for none)."""
    found = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text())
    return [((page.parent / target).resolve() if target else page.resolve(), anchor)
            for target, anchor in found if not re.match(r"\w+:", target)]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces
    as hyphens."""
    headings = re.findall(r"^#+ (.*)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_page_is_linked_from_readme_and_index() -> None:
    """Every docs/ page is linked from README.md and from docs/index.md, and every link
    between them points at a file, and a heading in it, that exists."""
    pages = {p.resolve() for p in DOCS.rglob("*.md")}
    for source in (ROOT / "README.md", DOCS / "index.md"):
        missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked(source) - {source})
        assert not missing, f"{source.name} links no {missing}"
    for page in [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "systemd" / "README.md",
                 *pages]:
        broken = [f"{t}#{a}" for t, a in links(page)
                  if not t.exists() or (a and t.suffix == ".md" and a not in anchors(t))]
        assert not broken, f"{page.relative_to(ROOT)} links to missing {broken}"


def test_model_keys_sees_nested_and_aliased_keys() -> None:
    """The key walk reaches nested tables, store types and aliases (``[lambda]``)."""
    keys = model_keys(Settings) | model_keys(LaunchConfig)
    assert {"trainer.restart.policy", "vllm.health.stall_timeout", "storage/s3.bucket",
            "services.name", "lambda.launch_interval", "ssh.hosts.gpu"} <= keys


def test_config_examples_fit_in_100_columns() -> None:
    """The examples in config/ keep their comments short (wrapped at 100 columns); the long
    explanations are in docs/configuration.md and docs/launch.md."""
    long = [f"{path.name}:{number}"
            for path in sorted((ROOT / "config").glob("*.toml"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 100]
    assert not long, f"lines over 100 columns: {long}"

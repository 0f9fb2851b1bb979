"""What pip installs into a launch's venv on the host: traind's own requirements, read from its
installed package metadata (its code is shipped, not installed from an index), so the list
never falls behind pyproject.toml."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from importlib import metadata

_EXTRA = re.compile(r"""^(?:(?P<rest>.+?)\s+and\s+)?extra\s*==\s*["'](?P<name>[^"']+)["']$""")


def _normal(extra: str) -> str:
    return re.sub(r"[-_.]+", "-", extra).lower()


def select(requires: Iterable[str], offered: Sequence[str], extras: Sequence[str]) -> list[str]:
    """The requirement strings of the base package plus ``extras``, from metadata's
    ``Requires-Dist`` lines, with the ``extra == ...`` marker removed (other markers stay, for
    pip to evaluate on the host). ValueError names an extra the package does not offer."""
    wanted = {_normal(e) for e in extras}
    unknown = sorted(wanted - {_normal(e) for e in offered})
    if unknown:
        raise ValueError(
            f"traind has no extra {', '.join(map(repr, unknown))} "
            f"(it offers: {', '.join(offered) or 'none'})"
        )
    chosen = []
    for line in requires:
        spec, _, marker = (part.strip() for part in line.partition(";"))
        if "extra" not in marker:
            chosen.append(line.strip())
            continue
        found = _EXTRA.match(marker)
        if found is None or "extra" in (found["rest"] or ""):
            raise ValueError(f"cannot read traind's requirement {line!r}")
        if _normal(found["name"]) in wanted:
            chosen.append(f"{spec}; {found['rest']}" if found["rest"] else spec)
    return chosen


def traind_requirements(extras: Sequence[str]) -> list[str]:
    """traind's requirements with ``extras``, from the metadata of the installed traind."""
    try:
        dist = metadata.distribution("traind")
    except metadata.PackageNotFoundError as exc:
        raise ValueError(
            "traind's package metadata is not installed (pip install -e . in the checkout), "
            "so the host's packages are unknown; or set [install] venv = false"
        ) from exc
    return select(dist.requires or (), dist.metadata.get_all("Provides-Extra") or [], extras)

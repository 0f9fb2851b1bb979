"""A small root filesystem made from what is on this machine, as a tarball for
``docker import``: a base image without a registry.

It holds ``/bin/sh``, ``mktemp`` and ``rm``, this Python (its standard library, without its tests
and GUI) with the distributions ``traind`` needs installed into it (plus pip and setuptools,
so that a build on top can pip-install traind offline), and every shared library those link
against, found with ``ldd``. Paths are the host's own, symlinks included (``/lib`` →
``usr/lib``), so a directory of the host bind-mounted at its own path (a virtualenv, a
checkout) runs in it as it does here.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement

STDLIB_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                  "site-packages", "__pycache__"}
"""Top-level entries of the standard library left out: big and never used here."""
PROGRAMS = ("/usr/bin/mktemp", "/usr/bin/rm", "/usr/bin/sleep")
"""Programs beside the shell: what a job's entry command (launch's jobflow), the Docker
adapter's timeout and the container recipe's RUN use."""


def closure(names: Iterable[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``names`` and everything they require (no extras)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in found:
            continue
        found[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def _libraries(binaries: list[Path]) -> set[Path]:
    """The shared libraries ``binaries`` load, as ldd resolves them here."""
    said = subprocess.run(["ldd", *map(str, binaries)], capture_output=True, text=True,
                          timeout=120).stdout
    libs = {Path(m) for m in re.findall(r"=> (/\S+)", said)}
    libs.update(Path(m) for m in re.findall(r"^\s+(/\S+) \(", said, re.M))  # the loader
    return libs


class _Tree:
    """Members of the tarball, each added once, its parents (and symlinks' targets) first."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.added: set[str] = set()

    def add(self, path: str) -> None:
        path = os.path.normpath(path)
        if path in self.added or path == "/":
            return
        self.add(os.path.dirname(path))
        self.added.add(path)
        info = self.tar.gettarinfo(path, arcname=path.lstrip("/"))
        if info.isreg():
            with open(path, "rb") as f:
                self.tar.addfile(info, f)
        else:
            self.tar.addfile(info)
        if info.issym():
            self.add(os.path.join(os.path.dirname(path), os.readlink(path)))

    def add_tree(self, root: Path) -> None:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            self.add(dirpath)
            for name in filenames:
                self.add(os.path.join(dirpath, name))

    def directory(self, path: str, mode: int) -> None:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(info)
        self.added.add(path)


def python_rootfs(tarball: Path, libraries_of: Iterable[Path] = ()) -> Path:
    """Write the root filesystem to ``tarball``, with the shared libraries ``libraries_of``
    (binaries mounted in later, e.g. torch's) link against; return this Python's path."""
    base = Path(sys.base_prefix)
    python = Path(os.path.realpath(base / "bin" / f"python{sys.version_info[0]}."
                                   f"{sys.version_info[1]}"))
    stdlib = Path(sysconfig.get_paths(vars={"installed_base": str(base)})["stdlib"])
    site = stdlib / "site-packages"
    dists = closure(["traind", "pip", "setuptools"])
    dists.pop("traind")  # what the image builds on top installs it
    binaries: list[Path] = [python, Path(os.path.realpath("/bin/sh")), *map(Path, PROGRAMS),
                            *libraries_of]
    with tarfile.open(tarball, "w") as tar:
        tree = _Tree(tar)
        tree.directory("/tmp", 0o1777)
        tree.add("/bin/sh")
        for program in PROGRAMS:
            tree.add(program)
        tree.add(str(python))
        tree.add(str(base / "bin" / "python3"))
        for entry in stdlib.iterdir():
            if entry.name not in STDLIB_SKIPPED and not entry.name.startswith("config-"):
                tree.add_tree(entry) if entry.is_dir() else tree.add(str(entry))
        binaries += (stdlib / "lib-dynload").glob("*.so")
        tree.add(str(site))
        for dist in dists.values():
            for file in dist.files or []:
                source = Path(str(file.locate()))
                if {"__pycache__", ".."} & set(file.parts) or not source.is_file():
                    continue  # caches, and scripts outside site-packages
                target = site / file
                _add_as(tar, tree, source, target)
                if target.suffix == ".so":
                    binaries.append(source)
        for lib in _libraries(binaries):
            if "site-packages" not in lib.parts:  # a distribution's own: copied with it
                tree.add(str(lib))
    return python


def _add_as(tar: tarfile.TarFile, tree: _Tree, source: Path, target: Path) -> None:
    """Add the regular file ``source`` at ``target`` (an installed file moved into the
    image's site-packages), with the directories above it made for the image."""
    _directories(tree, target.parent)
    info = tar.gettarinfo(str(source), arcname=str(target).lstrip("/"))
    with open(source, "rb") as f:
        tar.addfile(info, f)
    tree.added.add(str(target))


def _directories(tree: _Tree, directory: Path) -> None:
    if str(directory) not in tree.added:
        _directories(tree, directory.parent)
        tree.directory(str(directory), 0o755)

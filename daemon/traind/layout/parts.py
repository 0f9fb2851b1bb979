"""Parts of a multi-node checkpoint: each host's files, and when the whole is committed.

With ``[run] nodes = N`` every host stores the files its own ``checkpoint-N`` holds under
the shared ``<tag>/`` and a part manifest beside them (``traind-part-<rank>.json``). The
checkpoint is committed — one ``traind-manifest.json`` listing the union — only when all N
parts are stored. Pure: a backend reads the parts, ``union`` decides.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from traind.errors import IntegrityError
from traind.layout.fields import count, decimal, obj, read, real, text
from traind.layout.keys import PART_CLAIM_PREFIX as PART_CLAIM_PREFIX
from traind.layout.keys import PART_PREFIX as PART_PREFIX
from traind.layout.keys import check_component, check_tag
from traind.layout.manifest import (
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    TrainerFacts,
    Writer,
    check_version,
    parse_files,
    to_json,
)


def part_name(rank: int) -> str:
    """The part manifest's name beside the checkpoint's files: ``traind-part-<rank>.json``."""
    return f"{PART_PREFIX}{rank}.json"


def part_rank(name: str) -> int | None:
    """The node rank in a part manifest's name (``traind-part-<rank>.json``); None when
    ``name`` is not one."""
    if name.startswith(PART_PREFIX) and name.endswith(".json"):
        return decimal(name.removeprefix(PART_PREFIX).removesuffix(".json"))
    return None


def part_claim_name(rank: int) -> str:
    """The claim on node ``rank``'s part of a tag: ``traind-writer-<rank>.json``."""
    return f"{PART_CLAIM_PREFIX}{rank}.json"


@dataclass(frozen=True)
class Part:
    """One host's part of a checkpoint: the files it stored, with sizes and sha256, the
    node rank it stored them as, in a job of ``nodes`` hosts, and its writer."""

    run: str
    tag: str
    step: int
    node_rank: int
    nodes: int
    writer: Writer
    files: tuple[FileEntry, ...]
    trainer: TrainerFacts = field(default_factory=TrainerFacts)
    created_at: float = field(default_factory=time.time)
    host: str = field(default_factory=socket.gethostname)
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        """The part manifest's body in the store."""
        return to_json(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> Part:
        """Parse a part manifest; raise IntegrityError when it is malformed."""
        return read(data, "part manifest", cls._of)

    @classmethod
    def _of(cls, raw: Mapping[str, Any]) -> Part:
        check_version(raw, "part manifest")
        nodes = count(raw, "nodes")
        return cls(
            run=check_component(text(raw, "run"), "run name"),
            tag=check_tag(text(raw, "tag")),
            step=count(raw, "step"),
            node_rank=count(raw, "node_rank", nodes),
            nodes=nodes,
            writer=Writer.of(obj(raw, "writer")),
            files=parse_files(raw["files"], least=0),
            trainer=TrainerFacts.of(raw.get("trainer") or {}),
            created_at=real(raw, "created_at"),
            host=text(raw, "host"),
        )


class PartsDisagreeError(IntegrityError):
    """The parts of one checkpoint cannot make one whole: the same file with different
    bytes, or parts of different steps, runs or job sizes. The checkpoint fails loudly."""


@dataclass(frozen=True)
class Incomplete:
    """Not every part is stored yet: the ranks ``present`` and the ranks ``missing``."""

    present: tuple[int, ...]
    missing: tuple[int, ...]


def union(tag: str, parts: Iterable[Part], nodes: int, committer: Writer) -> Manifest | Incomplete:
    """The committed manifest of ``tag`` from its ``parts`` — every file of every part, a
    path two hosts stored once when their bytes agree — or Incomplete while a rank of
    0..nodes-1 has no part. Raise PartsDisagreeError when the parts cannot be one whole;
    ``committer`` (the host writing the manifest) is its writer."""
    by_rank: dict[int, Part] = {}
    for part in parts:
        if (part.tag, part.nodes) != (tag, nodes):
            raise PartsDisagreeError(f"{tag}: part of node {part.node_rank} is for {part.tag} "
                                     f"of a {part.nodes}-node job, not of {nodes} nodes")
        if (held := by_rank.setdefault(part.node_rank, part)) != part:
            raise PartsDisagreeError(f"{tag}: two parts for node {part.node_rank}, by "
                                     f"{held.writer} and {part.writer}")
    missing = tuple(rank for rank in range(nodes) if rank not in by_rank)
    if missing:
        return Incomplete(tuple(sorted(by_rank)), missing)
    ordered = [by_rank[rank] for rank in range(nodes)]
    first = ordered[0]
    for part in ordered[1:]:
        if (part.run, part.step) != (first.run, first.step):
            raise PartsDisagreeError(f"{tag}: node {part.node_rank} stored step {part.step} "
                                     f"of run {part.run}, node 0 step {first.step} of "
                                     f"run {first.run}")
    files: dict[str, tuple[int, FileEntry]] = {}
    for part in ordered:
        for entry in part.files:
            rank, kept = files.setdefault(entry.path, (part.node_rank, entry))
            if kept != entry:
                raise PartsDisagreeError(
                    f"{tag}: {entry.path} differs between node {rank} ({kept.size} bytes, "
                    f"sha256 {kept.sha256[:12]}…) and node {part.node_rank} ({entry.size} "
                    f"bytes, sha256 {entry.sha256[:12]}…)")
    trainer = next((p.trainer for p in ordered if p.trainer != TrainerFacts()), TrainerFacts())
    return Manifest(
        run=first.run,
        tag=tag,
        step=first.step,
        files=tuple(entry for _, entry in sorted(files.values(), key=lambda r: r[1].path)),
        trainer=trainer,
        host=committer.host,
        writer=committer,
    )

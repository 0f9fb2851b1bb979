"""Parts of a multi-node checkpoint: their manifests, and when the union is committed."""

from __future__ import annotations

import json

import pytest

from traind.errors import IntegrityError
from traind.layout.manifest import FileEntry, Manifest, TrainerFacts, Writer
from traind.layout.parts import (
    Incomplete,
    Part,
    PartsDisagreeError,
    part_name,
    union,
)

W0, W1, W2 = (Writer(f"{i}" * 32, f"node{i}") for i in range(3))
CONFIG = FileEntry("config.json", 10, "c" * 64)


def part(rank: int, *files: FileEntry, nodes: int = 2, step: int = 4,
         trainer: TrainerFacts | None = None) -> Part:
    writer = (W0, W1, W2)[rank]
    return Part("run", "checkpoint-4", step, rank, nodes, writer, files,
                trainer or TrainerFacts(), host=writer.host)


def test_part_manifest_round_trip() -> None:
    """A part manifest keeps every field through its JSON form, beside the files."""
    p = part(1, FileEntry("__1_0.distcp", 5, "a" * 64), trainer=TrainerFacts(global_step=4))
    assert Part.from_json(p.to_json()) == p
    assert part_name(1) == "traind-part-1.json"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 99}, "version"),
        ({"node_rank": 2}, "node_rank 2 is not an integer in 0..1"),
        ({"files": [{"path": "../x", "size": 1, "sha256": "a"}]}, "unsafe relative path"),
        ({"writer": None}, "malformed part manifest"),
    ],
)
def test_malformed_part_manifest_is_refused(change: dict[str, object], message: str) -> None:
    """A part manifest of another version, an out-of-job rank, an unsafe path or no writer
    is an IntegrityError, never a part."""
    raw = {**json.loads(part(0).to_json()), **change}
    with pytest.raises(IntegrityError, match=message):
        Part.from_json(json.dumps(raw))


def test_nothing_is_committed_while_a_part_is_missing() -> None:
    """Until every rank's part is stored the checkpoint is incomplete, naming who is in."""
    parts = [part(2, nodes=3), part(0, nodes=3)]
    assert union("checkpoint-4", parts, 3, W0) == Incomplete(present=(0, 2), missing=(1,))
    assert union("checkpoint-4", [], 2, W0) == Incomplete(present=(), missing=(0, 1))


def test_union_lists_every_file_once() -> None:
    """All parts in: one manifest with the union of the files, a file both hosts saved with
    the same bytes listed once, trainer facts from the part that has them."""
    facts = TrainerFacts(global_step=4)
    p0 = part(0, FileEntry("__0_0.distcp", 5, "a" * 64), FileEntry(".metadata", 2, "m" * 64),
              CONFIG, trainer=facts)
    p1 = part(1, FileEntry("__1_0.distcp", 6, "b" * 64), CONFIG)
    manifest = union("checkpoint-4", [p1, p0], 2, W1)
    assert isinstance(manifest, Manifest)
    assert [f.path for f in manifest.files] == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                "config.json"]
    assert manifest.total_bytes == 23
    assert (manifest.step, manifest.trainer, manifest.writer) == (4, facts, W1)


def test_same_path_with_other_bytes_fails_the_checkpoint() -> None:
    """The same relative path stored by two hosts with different bytes is refused loudly,
    naming the path and both nodes."""
    other = FileEntry("config.json", 10, "d" * 64)
    with pytest.raises(PartsDisagreeError, match=r"config.json differs between node 0 .* "
                                                 r"and node 1"):
        union("checkpoint-4", [part(0, CONFIG), part(1, other)], 2, W0)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([part(0), part(1, step=3)], "node 1 stored step 3"),
        ([part(0), part(1, nodes=3)], "of a 3-node job, not of 2 nodes"),
        ([part(0), part(1), part(1, CONFIG)], "two parts for node 1"),
    ],
)
def test_parts_of_different_saves_or_jobs_are_refused(parts: list[Part], message: str) -> None:
    """Parts of different steps, job sizes, or two different parts for one rank never make
    a committed checkpoint."""
    with pytest.raises(PartsDisagreeError, match=message):
        union("checkpoint-4", parts, 2, W0)

"""Manifest round trip, trainer facts, verification, and key validation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from traind.errors import IntegrityError, UnsafePathError
from traind.layout.keys import check_relpath, check_tag
from traind.layout.manifest import (
    FileEntry,
    Manifest,
    TrainerFacts,
    Writer,
    read_trainer_facts,
    verify,
)

M = Manifest(
    "run", "checkpoint-4", 4, (FileEntry("a/b.bin", 3, "ab" * 32), FileEntry("c", 1, "0" * 64)),
    writer=Writer("a" * 32, "h"),
)


def test_round_trip() -> None:
    """to_json/from_json keep every field, and total_bytes is written."""
    data = M.to_json()
    assert json.loads(data)["total_bytes"] == 4
    assert Manifest.from_json(data) == M


def test_malformed_manifest_is_an_integrity_error() -> None:
    """Garbage, a wrong version or an unsafe path in a manifest is rejected."""
    with pytest.raises(IntegrityError):
        Manifest.from_json(b"{")
    raw = json.loads(M.to_json())
    raw["version"] = 99
    with pytest.raises(IntegrityError, match="version"):
        Manifest.from_json(json.dumps(raw))
    raw = json.loads(M.to_json())
    raw["files"][0]["path"] = "../../etc/passwd"
    with pytest.raises(IntegrityError):
        Manifest.from_json(json.dumps(raw))


def test_a_made_up_manifest_names_no_writer_and_is_checked_as_any() -> None:
    """A manifest made up for a checkpoint no traind committed reads back naming no writer,
    every other field checked as in a stored one."""
    made = replace(M, writer=None)
    assert Manifest.unwritten_from_json(made.to_json()) == made
    with pytest.raises(IntegrityError, match="malformed manifest: files is not a list"):
        Manifest.unwritten_from_json(json.dumps(json.loads(made.to_json()) | {"files": []}))


def test_trainer_facts(tmp_path: Path) -> None:
    """global_step and the best checkpoint come from trainer_state.json when present."""
    assert read_trainer_facts(tmp_path).global_step is None
    (tmp_path / "trainer_state.json").write_text(
        json.dumps(
            {"global_step": 40, "best_metric": 0.5, "best_model_checkpoint": "/o/checkpoint-20"}
        )
    )
    facts = read_trainer_facts(tmp_path)
    assert (facts.global_step, facts.best_metric, facts.best_tag) == (40, 0.5, "checkpoint-20")


def test_verify() -> None:
    """Verification passes on exact matches and names every mismatching file."""
    verify(M, {"a/b.bin": (3, "ab" * 32), "c": (1, "0" * 64)})
    with pytest.raises(IntegrityError, match=r"a/b.bin: size 2 != manifest 3.*c: missing"):
        verify(M, {"a/b.bin": (2, "ab" * 32)})
    with pytest.raises(IntegrityError, match="c: sha256"):
        verify(M, {"a/b.bin": (3, "ab" * 32), "c": (1, "1" * 64)})


@pytest.mark.parametrize("bad", ["", ".", "..", "a b", ";rm -rf", "x/y", "é", "$(id)", "a\nb"])
def test_unsafe_tags(bad: str) -> None:
    """Tags are one safe component."""
    with pytest.raises(UnsafePathError):
        check_tag(bad)


@pytest.mark.parametrize(
    "bad",
    ["", "/abs", "../x", "a/../b", "a//b", "a/./b", "a/", "traind-manifest.json",
     "traind-writer.json", "traind-part-0.json", "traind-part-12.json", "traind-writer-0.json",
     "a\nb", "nul\0", "tab\t", "esc\x1b[0m", "\udcff-not-utf8"],
)
def test_unsafe_relpaths(bad: str) -> None:
    """Relative paths never escape, never collide with the manifest, hold no control
    character."""
    with pytest.raises(UnsafePathError):
        check_relpath(bad)


def test_safe_names_pass() -> None:
    """Names transformers writes are accepted."""
    assert check_tag("checkpoint-400") == "checkpoint-400"
    assert check_relpath("global_step400/mp_rank_00_model_states.pt")
    assert check_relpath(".metadata")
    assert check_relpath("sub/traind-part-0.json")  # only beside the manifest is reserved
    assert check_relpath("traind-part-0.txt")


@pytest.mark.parametrize("name", ["a b.bin", "ü/ñ.json", "q'\"$(x)`;&.bin", " lead", "日本/語 .pt"])
def test_relpaths_with_spaces_and_unicode_pass(name: str) -> None:
    """File names with spaces, non-ASCII letters and shell characters are legal."""
    assert check_relpath(name) == name


def _lie(path: str, value: object) -> bytes:
    """M's JSON with the field at ``path`` (dot-separated, list indexes as digits) set."""
    raw = json.loads(M.to_json())
    *parents, last = path.split(".")
    node = raw
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (_lie("files", []), "files is not a list of at least 1 file"),
        (_lie("files.1", {"path": "a/b.bin", "size": 3, "sha256": "ab" * 32}),
         "files lists 'a/b.bin' more than once"),
        (_lie("created_at", float("nan")), "NaN is not a number JSON allows"),
        (_lie("created_at", float("inf")), "Infinity is not a number JSON allows"),
        (_lie("created_at", "yesterday"), "created_at 'yesterday' is not a finite number"),
        (_lie("step", 2**63), f"step {2**63} is not an integer in 0..{2**63 - 1}"),
        (_lie("step", -1), "step -1 is not an integer"),
        (_lie("step", True), "step True is not an integer"),
        (_lie("step", 4.5), "step 4.5 is not an integer"),
        (_lie("files.0.size", 2**64), "size .* is not an integer"),
        (_lie("files.0.sha256", "AB" * 32), "sha256 'ABAB.* is not 64 lowercase hex digits"),
        (_lie("files.0.sha256", "ab"), "sha256 'ab' is not 64 lowercase hex digits"),
        (_lie("files.0.path", ["a"]), r"path \['a'\] is not a string"),
        (_lie("files.0", "a/b.bin"), "files holds an entry that is not an object"),
        (_lie("total_bytes", 5), "total_bytes 5 is not the sum of the files' sizes"),
        (_lie("trainer", {"global_step": "40"}), "global_step '40' is not an integer"),
        (_lie("trainer", {"best_metric": [1.0]}), r"best_metric \[1.0\] is not a finite number"),
        (_lie("trainer", {"loss": 1.0}), r"trainer holds unknown fields \['loss'\]"),
        (_lie("version", True), "unsupported manifest version True"),
        (_lie("run", "../other"), "unsafe run name"),
        (_lie("writer", {"id": 7, "host": "h"}), "id 7 is not a string"),
        (_lie("writer", None), "writer None is not an object"),
        (json.dumps({k: v for k, v in json.loads(M.to_json()).items() if k != "writer"}).encode(),
         "no 'writer'"),
        (_lie("files.0.path", "a/" + "b" * 256), "unsafe relative path .* a name longer than"),
        (_lie("files.0.path", "a/" * 2048 + "b"), "unsafe relative path .* longer than 4095"),
        (_lie("tag", "checkpoint-" + "4" * 250), "unsafe tag"),
        (_lie("total_bytes", True), "total_bytes True is not an integer"),
        (_lie("host", "h" * 1000), None),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
        (b"[]", "not a JSON object"),
        (b"\xff\xfe", "Expecting value"),
        (b" " * (64 * 1024 * 1024 + 1), "67108865 bytes, more than the 67108864"),
    ],
)
def test_a_lying_manifest_is_refused_in_one_line(data: bytes, problem: str | None) -> None:
    """Every number finite and in range, at least one file, no duplicate, a sha256 of 64
    lowercase hex digits, facts of their types, bounded size and nesting: anything else is
    one IntegrityError naming the problem (never RecursionError or OverflowError)."""
    if problem is None:  # a long host is no lie
        assert Manifest.from_json(data).host == "h" * 1000
        return
    with pytest.raises(IntegrityError, match=f"malformed manifest: {problem}") as caught:
        Manifest.from_json(data)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 300


def test_trainer_facts_a_manifest_cannot_hold_are_left_out(tmp_path: Path) -> None:
    """A NaN best metric or a step past 2**63 in trainer_state.json (a diverged run) is no
    fact, so the manifest written still reads back (it would otherwise hide the checkpoint)."""
    (tmp_path / "trainer_state.json").write_text(
        '{"global_step": 99999999999999999999, "best_metric": NaN, '
        '"best_model_checkpoint": 3, "log_history": [{"loss": NaN}]}')
    facts = read_trainer_facts(tmp_path)
    assert facts == TrainerFacts()
    made = Manifest("run", "checkpoint-4", 4, M.files, trainer=facts, writer=M.writer)
    assert Manifest.from_json(made.to_json()) == made
    (tmp_path / "trainer_state.json").write_text("[" * 100_000)
    assert read_trainer_facts(tmp_path) == TrainerFacts()


"""Manifest round trip, trainer facts, verification, and key validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traind.errors import IntegrityError, UnsafePathError
from traind.layout.keys import check_relpath, check_tag
from traind.layout.manifest import FileEntry, Manifest, read_trainer_facts, verify

M = Manifest(
    "run", "checkpoint-4", 4, (FileEntry("a/b.bin", 3, "ab" * 32), FileEntry("c", 1, "0" * 64))
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

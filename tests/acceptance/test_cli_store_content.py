"""What a store holds is input: the commands (list, pull, verify, prune, push) run as an
operator runs them against a local store in which a user copied a checkpoint's directory or
a manifest lies, and each costs at most the checkpoint it touches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.acceptance.test_cli import cfg, make_ckpt, traind

from traind.layout.keys import MANIFEST_NAME

__all__ = ["cfg"]  # the fixture, shared with test_cli


def strict(text: str) -> Any:
    """``text`` parsed as strict JSON: a NaN or Infinity in it fails the test."""
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")
    return json.loads(text, parse_constant=refuse)


def pushed(cfg: Path, tmp_path: Path, *steps: int) -> Path:
    """Push checkpoint-<step> for each of ``steps``; return the run's directory in the store."""
    for step in steps:
        result = traind("push", "-c", str(cfg), str(make_ckpt(tmp_path / "src", step)))
        assert result.returncode == 0, result.stderr
    return tmp_path / "store" / "exp"


def tags(cfg: Path) -> list[str]:
    """What ``traind list --json`` lists (strict JSON), by tag."""
    result = traind("list", "-c", str(cfg), "--json")
    assert result.returncode == 0, result.stderr
    return [row["tag"] for row in strict(result.stdout)]


def lie(manifest: Path, **fields: Any) -> None:
    """Rewrite the stored manifest with ``fields`` changed (NaN written as JSON's NaN)."""
    raw = json.loads(manifest.read_text())
    raw.update(fields)
    manifest.write_text(json.dumps(raw))


def test_a_copy_of_the_newest_checkpoint_is_never_listed_pruned_or_pulled(
    cfg: Path, tmp_path: Path
) -> None:
    """A user's ``cp -r checkpoint-300 backup-300`` inside the store is not a second
    checkpoint-300: list shows each checkpoint once, prune with keep_last = 1 keeps the
    real newest and leaves the copy alone, and pull latest restores checkpoint-300."""
    run = pushed(cfg, tmp_path, 100, 300)
    shutil.copytree(run / "checkpoint-300", run / "backup-300")
    cfg.write_text(cfg.read_text().replace("keep_last = 100", "keep_last = 1"))
    listed = traind("list", "-c", str(cfg), "--json")
    assert [r["tag"] for r in strict(listed.stdout)] == ["checkpoint-100", "checkpoint-300"]
    assert "manifest_misplaced" in listed.stderr
    assert str(run / "backup-300" / MANIFEST_NAME) in listed.stderr
    pruned = traind("prune", "-c", str(cfg))
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stderr.count("manifest_misplaced") == 1
    assert tags(cfg) == ["checkpoint-300"]
    assert (run / "backup-300" / MANIFEST_NAME).is_file()
    pulled = traind("pull", "-c", str(cfg), "latest", str(tmp_path / "back"))
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == str(tmp_path / "back" / "checkpoint-300")


def test_a_newest_manifest_that_lists_no_files_is_passed_over(cfg: Path, tmp_path: Path) -> None:
    """The newest manifest lists no files: it is refused in one line, pull latest restores
    the next older checkpoint, and verify --all reports both and exits non-zero."""
    run = pushed(cfg, tmp_path, 1, 2)
    lie(run / "checkpoint-2" / MANIFEST_NAME, files=[], total_bytes=0)
    pulled = traind("pull", "-c", str(cfg), "latest", str(tmp_path / "back"))
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == str(tmp_path / "back" / "checkpoint-1")
    assert "files is not a list of at least 1 file" in pulled.stderr
    assert not (tmp_path / "back" / "checkpoint-2").exists()
    verified = traind("verify", "-c", str(cfg), "--all")
    assert verified.returncode == 1, verified.stdout
    assert "checkpoint-1: OK" in verified.stdout
    assert f"{run / 'checkpoint-2' / MANIFEST_NAME}: unreadable manifest" in verified.stdout
    assert "2 checkpoint(s) checked" in verified.stdout
    assert "1 OK, 1 with problems" in verified.stdout


def test_one_malformed_manifest_costs_only_its_checkpoint(cfg: Path, tmp_path: Path) -> None:
    """Deeply nested JSON, a duplicate file, a step past 2**63 or a NaN time in one
    checkpoint's manifest each leave list (strict JSON), pull, verify and prune working for
    the others, without a traceback."""
    run = pushed(cfg, tmp_path, 1, 2, 3, 4, 5)
    (run / "checkpoint-2" / MANIFEST_NAME).write_text("[" * 100_000 + "]" * 100_000)
    files = json.loads((run / "checkpoint-3" / MANIFEST_NAME).read_text())["files"]
    lie(run / "checkpoint-3" / MANIFEST_NAME, files=files + files[:1])
    lie(run / "checkpoint-4" / MANIFEST_NAME, step=2**64)
    lie(run / "checkpoint-5" / MANIFEST_NAME, created_at=float("nan"))
    cfg.write_text(cfg.read_text().replace("keep_last = 100", "keep_last = 1"))
    runs = {
        "list": traind("list", "-c", str(cfg), "--json"),
        "pull": traind("pull", "-c", str(cfg), "latest", str(tmp_path / "back")),
        "verify": traind("verify", "-c", str(cfg), "--all"),
        "prune": traind("prune", "-c", str(cfg), "--dry-run"),
    }
    for name, result in runs.items():
        assert "Traceback" not in result.stderr, (name, result.stderr)
        assert "nested too deeply" in result.stderr, name
        assert "more than once" in result.stderr, name
        assert f"step {2**64} is not an integer" in result.stderr, name
        assert "NaN is not a number JSON allows" in result.stderr, name
    assert [r["tag"] for r in strict(runs["list"].stdout)] == ["checkpoint-1"]
    assert runs["pull"].stdout.strip() == str(tmp_path / "back" / "checkpoint-1")
    assert runs["verify"].returncode == 1
    assert "1 OK, 4 with problems" in runs["verify"].stdout
    assert "checkpoint-1" in runs["prune"].stdout
    assert "checkpoint-5" not in runs["prune"].stdout


def test_push_of_a_step_beyond_two_to_the_63_is_one_clear_error(
    cfg: Path, tmp_path: Path
) -> None:
    """``push --tag checkpoint-<2**64>`` is refused in one line naming the bound (no
    OverflowError traceback), and nothing is stored."""
    src = make_ckpt(tmp_path / "src", 1)
    result = traind("push", "-c", str(cfg), "--tag", f"checkpoint-{2**64}", str(src))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "OverflowError" not in result.stderr
    assert "is not below 2**63" in result.stderr
    assert tags(cfg) == []


def test_verify_all_goes_on_past_a_checkpoint_it_cannot_read(cfg: Path, tmp_path: Path) -> None:
    """A directory where one checkpoint's file should be is that checkpoint's problem:
    verify --all reports it and still checks every other checkpoint, exit non-zero."""
    run = pushed(cfg, tmp_path, 1, 2, 3)
    weights = run / "checkpoint-2" / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    verified = traind("verify", "-c", str(cfg), "--all")
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "Traceback" not in verified.stderr
    assert "checkpoint-1: OK" in verified.stdout
    assert "checkpoint-3: OK" in verified.stdout
    assert "2 OK, 1 with problems" in verified.stdout

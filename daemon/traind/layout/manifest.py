"""The manifest: written last, it is what makes a checkpoint exist in the store."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from traind.errors import IntegrityError
from traind.layout.keys import check_relpath, check_tag

FORMAT_VERSION = 1
log = structlog.get_logger("traind.manifest")


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint, size and sha256."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class TrainerFacts:
    """What ``trainer_state.json`` says about the run at this checkpoint, when present."""

    global_step: int | None = None
    best_metric: float | None = None
    best_model_checkpoint: str | None = None

    @property
    def best_tag(self) -> str | None:
        """The tag (directory name) of the trainer's best checkpoint, if it names one."""
        if not self.best_model_checkpoint:
            return None
        return Path(self.best_model_checkpoint).name


@dataclass(frozen=True)
class Writer:
    """The traind that wrote a checkpoint: its id (one per state_dir) and its host.

    Kept explicit so that a checkpoint several hosts write on purpose can later name each
    host's part; today one writer owns a checkpoint whole.
    """

    id: str
    host: str

    def __str__(self) -> str:
        return f"{self.id[:12]}@{self.host}"

    def to_json(self) -> bytes:
        """The claim object's body in the store."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Writer:
        """Parse a claim object; raise IntegrityError if malformed."""
        try:
            raw = json.loads(data)
            return cls(id=str(raw["id"]), host=str(raw["host"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"malformed writer claim: {exc}") from exc


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: every file with its size and sha256, and facts about it."""

    run: str
    tag: str
    step: int
    files: tuple[FileEntry, ...]
    created_at: float = field(default_factory=time.time)
    host: str = field(default_factory=socket.gethostname)
    trainer: TrainerFacts = field(default_factory=TrainerFacts)
    version: int = FORMAT_VERSION
    writer: Writer | None = None
    """Who committed it; None in manifests written before writers were recorded."""

    @property
    def total_bytes(self) -> int:
        """The sum of the sizes of all files."""
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        """Serialise to the on-store JSON form."""
        return to_json(self, total_bytes=self.total_bytes)

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        """Parse and validate the on-store JSON form; raise IntegrityError if malformed."""
        try:
            raw = json.loads(data)
            if raw["version"] != FORMAT_VERSION:
                raise ValueError(f"unsupported manifest version {raw['version']!r}")
            files = parse_files(raw["files"])
            return cls(
                run=str(raw["run"]),
                tag=check_tag(str(raw["tag"])),
                step=int(raw["step"]),
                files=files,
                created_at=float(raw["created_at"]),
                host=str(raw["host"]),
                trainer=TrainerFacts(**raw.get("trainer") or {}),
                version=int(raw["version"]),
                writer=Writer(str(w["id"]), str(w["host"])) if (w := raw.get("writer")) else None,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"malformed manifest: {exc}") from exc


def listed(data: bytes | str, where: str) -> Manifest | None:
    """The manifest a listing found at ``where``, or None when it is malformed: that is
    logged as an error naming it, and the checkpoint is left out (so never pruned), as one
    damaged object must not hide every other checkpoint from list, pull, prune and restore."""
    try:
        return Manifest.from_json(data)
    except IntegrityError as exc:
        log.error("manifest_unreadable", where=where, error=str(exc),
                  hint="this checkpoint is not listed; repair or delete its manifest")
        return None


def trainer_facts(state: Mapping[str, Any]) -> TrainerFacts:
    """Extract the facts a manifest keeps from a parsed ``trainer_state.json``."""
    step = state.get("global_step")
    metric = state.get("best_metric")
    best = state.get("best_model_checkpoint")
    return TrainerFacts(
        global_step=int(step) if isinstance(step, int) else None,
        best_metric=float(metric) if isinstance(metric, int | float) else None,
        best_model_checkpoint=str(best) if best else None,
    )


def read_trainer_facts(checkpoint_dir: Path) -> TrainerFacts:
    """Read ``trainer_state.json`` from a checkpoint directory; empty facts when absent."""
    try:
        state = json.loads((checkpoint_dir / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return TrainerFacts()
    return trainer_facts(state) if isinstance(state, dict) else TrainerFacts()


def mismatch(entry: FileEntry, size: int, sha256: str) -> str | None:
    """What is wrong with ``entry``'s file when it has ``size`` bytes hashing to ``sha256``."""
    if size != entry.size:
        return f"{entry.path}: size {size} != manifest {entry.size}"
    if sha256 != entry.sha256:
        return f"{entry.path}: sha256 {sha256[:12]}… != manifest {entry.sha256[:12]}…"
    return None


def verify(manifest: Manifest, got: Mapping[str, tuple[int, str]]) -> None:
    """Check ``got`` (path → (size, sha256)) against the manifest; raise IntegrityError."""
    problems = []
    for entry in manifest.files:
        if entry.path not in got:
            problems.append(f"{entry.path}: missing")
            continue
        if problem := mismatch(entry, *got[entry.path]):
            problems.append(problem)
    if problems:
        raise IntegrityError(
            f"checkpoint {manifest.tag} failed verification: " + "; ".join(problems)
        )


def to_json(record: Any, **extra: Any) -> bytes:
    """A manifest-like dataclass (a checkpoint's, or one host's part) as its on-store JSON,
    with ``extra`` fields added."""
    body = asdict(record)
    body["files"] = [asdict(f) for f in record.files]
    body.update(extra)
    return json.dumps(body, indent=1, sort_keys=True).encode()


def parse_files(raw: Any) -> tuple[FileEntry, ...]:
    """The ``files`` list of a stored manifest or part manifest, every path validated."""
    return tuple(
        FileEntry(check_relpath(str(f["path"])), int(f["size"]), str(f["sha256"])) for f in raw
    )

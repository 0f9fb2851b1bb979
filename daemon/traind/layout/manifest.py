"""The manifest: written last, it is what makes a checkpoint exist in the store."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from traind.errors import IntegrityError
from traind.layout.fields import INT_LIMIT, count, obj, optional, read, real, sha256, text
from traind.layout.keys import check_component, check_relpath, check_tag

FORMAT_VERSION = 1
log = structlog.get_logger("traind.manifest")


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint, size and sha256."""

    path: str
    size: int
    sha256: str


FACTS = frozenset({"global_step", "best_metric", "best_model_checkpoint"})
"""The fields of TrainerFacts, all a manifest's ``trainer`` object may hold."""


@dataclass(frozen=True)
class TrainerFacts:
    """What ``trainer_state.json`` says about the run at this checkpoint, when present."""

    global_step: int | None = None
    best_metric: float | None = None
    best_model_checkpoint: str | None = None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> TrainerFacts:
        """The facts a parsed manifest keeps (ValueError when one is not of its type)."""
        if not isinstance(raw, dict):
            raise ValueError("trainer is not an object")
        if extra := set(raw) - FACTS:
            raise ValueError(f"trainer holds unknown fields {sorted(extra)}")
        return cls(global_step=optional(raw, "global_step", count),
                   best_metric=optional(raw, "best_metric", real),
                   best_model_checkpoint=optional(raw, "best_model_checkpoint", text))

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
        return read(data, "writer claim", cls.of)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Writer:
        """The writer a parsed claim or manifest names (ValueError, KeyError if none)."""
        return cls(id=text(raw, "id"), host=text(raw, "host"))


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
    writer: Writer | None = field(kw_only=True)
    """Who committed it, which a stored manifest always names (``from_json``). None only in
    the manifest made up for a checkpoint no traind committed, one HF Trainer pushed to the
    Hub itself (``protocol.trainer_pushed``: read with ``unwritten_from_json``)."""

    @property
    def total_bytes(self) -> int:
        """The sum of the sizes of all files."""
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        """Serialise to the on-store JSON form."""
        return to_json(self, total_bytes=self.total_bytes)

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        """Parse and validate the on-store JSON form, which names its writer; raise
        IntegrityError if malformed."""
        return read(data, "manifest", lambda raw: cls._of(raw, Writer.of(obj(raw, "writer"))))

    @classmethod
    def unwritten_from_json(cls, data: bytes | str) -> Manifest:
        """Parse and validate a manifest made up for a checkpoint no traind committed: every
        field checked as ``from_json`` checks it, and no writer read, as it names none
        (``writer``); raise IntegrityError if malformed."""
        return read(data, "manifest", lambda raw: cls._of(raw, None))

    @classmethod
    def _of(cls, raw: Mapping[str, Any], writer: Writer | None) -> Manifest:
        check_version(raw, "manifest")
        manifest = cls(
            run=check_component(text(raw, "run"), "run name"),
            tag=check_tag(text(raw, "tag")),
            step=count(raw, "step"),
            files=parse_files(raw["files"]),
            created_at=real(raw, "created_at"),
            host=text(raw, "host"),
            trainer=TrainerFacts.of(raw.get("trainer") or {}),
            writer=writer,
        )
        total = manifest.total_bytes
        if total >= INT_LIMIT or ("total_bytes" in raw and count(raw, "total_bytes") != total):
            raise ValueError(f"total_bytes {raw.get('total_bytes')!r} is not the sum of the "
                             f"files' sizes ({total}) below {INT_LIMIT}")
        return manifest


class Located(Protocol):
    """What a listing reads from a checkpoint's directory: a manifest or a part manifest,
    which names the run and tag it was written for."""

    @property
    def run(self) -> str: ...

    @property
    def tag(self) -> str: ...


Read = TypeVar("Read", bound=Located)
_misplaced: set[str] = set()
"""Where this process found a manifest of another place (warned once per path)."""


@dataclass(frozen=True)
class Unreadable:
    """A manifest a listing found at ``where`` and refused, ``error`` saying why."""

    where: str
    error: str


def listed(data: bytes | str, where: str, run: str, tag: str,
           parse: Callable[[bytes | str], Read]) -> Read | Unreadable | None:
    """What a listing found at ``where`` in ``run``'s ``<tag>/`` (``parse`` of ``data``),
    never listed, restored or pruned when it is malformed (Unreadable, logged as an error
    naming it: one damaged object must not hide every other checkpoint) or another run's
    or tag's (None: ``located``)."""
    try:
        found = parse(data)
    except IntegrityError as exc:
        return unreadable(where, exc)
    return located(found, run, tag, where)


def located(found: Read, run: str, tag: str, where: str) -> Read | None:
    """``found`` if it names ``run`` and ``tag``, the place it was read from (``where``);
    else None, with a warning once per ``where`` in this process: a copy of a checkpoint's
    directory inside the store is never a second checkpoint."""
    if (found.run, found.tag) == (run, tag):
        return found
    if where not in _misplaced:
        _misplaced.add(where)
        log.warning("manifest_misplaced", where=where, run=found.run, tag=found.tag,
                    expected_run=run, expected_tag=tag,
                    hint="ignored: never listed, restored or pruned (a copy of a "
                         "checkpoint's directory inside the store?)")
    return None


def check_version(raw: Mapping[str, Any], what: str) -> None:
    """ValueError unless ``raw`` is of this FORMAT_VERSION."""
    if type(raw["version"]) is not int or raw["version"] != FORMAT_VERSION:
        raise ValueError(f"unsupported {what} version {raw['version']!r}")


def unreadable(where: str, exc: IntegrityError) -> Unreadable:
    """The manifest at ``where`` cannot be used (malformed, or not a regular file): logged,
    so its checkpoint is left out of a listing."""
    log.error("manifest_unreadable", where=where, error=str(exc),
              hint="this checkpoint is not listed; repair or delete its manifest")
    return Unreadable(where, str(exc))


def trainer_facts(state: Mapping[str, Any]) -> TrainerFacts:
    """Extract the facts a manifest keeps from a parsed ``trainer_state.json``."""
    def kept(key: str, check: Callable[[Mapping[str, Any], str], Any]) -> Any:
        try:
            return optional(state, key, check)
        except ValueError:  # NaN, a step past INT_LIMIT: not a fact a manifest can hold
            return None

    return TrainerFacts(
        global_step=kept("global_step", count),
        best_metric=kept("best_metric", real),
        best_model_checkpoint=kept("best_model_checkpoint", text) or None,
    )


def read_trainer_facts(checkpoint_dir: Path) -> TrainerFacts:
    """Read ``trainer_state.json`` from a checkpoint directory; empty facts when absent."""
    try:
        state = json.loads((checkpoint_dir / "trainer_state.json").read_text())
    except (OSError, ValueError, RecursionError):
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
    body = asdict(replace(record, files=()))
    body["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in record.files]
    body.update(extra)
    return json.dumps(body, indent=1, sort_keys=True, allow_nan=False).encode()


def parse_files(raw: Any, least: int = 1) -> tuple[FileEntry, ...]:
    """The ``files`` list of a stored manifest or part manifest: at least ``least`` (a
    node of a multi-node job may store none), every path validated and listed once, every
    size and sha256 of its type."""
    if not isinstance(raw, list) or len(raw) < least:
        raise ValueError(f"files is not a list of at least {least} file(s)")
    files = tuple(FileEntry(check_relpath(text(f, "path")), count(f, "size"), sha256(f, "sha256"))
                  for f in raw if isinstance(f, dict))
    if len(files) != len(raw):
        raise ValueError("files holds an entry that is not an object")
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise ValueError(f"files lists {f.path!r} more than once")
        seen.add(f.path)
    return files

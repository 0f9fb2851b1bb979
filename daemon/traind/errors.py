"""The error hierarchy: one root, a few meaningful branches.

Library exceptions (OSError, botocore, asyncssh) are translated into these at the
boundary where they happen, with the original kept as ``__cause__``. Errors that carry a
type from a higher layer live beside it (the module in brackets); every one is drawn here,
and tests/unit/test_errors.py keeps this tree and the code in step::

    TraindError
    ├── ConfigError
    ├── RankError  [util.nodes]
    ├── UnsafePathError
    ├── JournalError
    ├── StorageError
    │   ├── TransientStorageError
    │   │   ├── ContendedError
    │   │   └── ConnectionLost  [storage.ssh.openssh.pipe]
    │   ├── NotFoundError
    │   ├── IntegrityError
    │   │   ├── MissingFilesError
    │   │   └── PartsDisagreeError  [layout.parts]
    │   ├── LinkedPathError
    │   ├── ProtocolError  [storage.ssh.openssh.wire]
    │   └── ConflictError  [protocol.ownership]
    │       └── ClaimHeldError  [protocol.ownership]
    ├── CheckpointError
    │   ├── SourceVanishedError  [checkpoints.intake.snapshot]
    │   ├── EmptyCheckpointError  [checkpoints.intake.snapshot]
    │   ├── RewrittenError  [checkpoints.intake.snapshot]
    │   ├── DroppedError  [checkpoints.commit.lifecycle]
    │   ├── PartsGoneError  [checkpoints.commit.lifecycle]
    │   └── PartsPendingError  [checkpoints.commit.lifecycle]
    ├── SupervisorError
    │   └── HealthRedirectError  [supervisor.health]
    ├── DaemonUnreachableError  [status.client]
    └── LaunchError  [launch.errors]
        ├── NoOffersError  [launch.errors]
        ├── ProvisionError  [launch.errors]
        │   ├── GPURequestError  [launch.providers.docker.engine]
        │   └── ImageNotFoundError  [launch.providers.docker.engine]
        ├── InstanceNotFoundError  [launch.errors]
        ├── HostUnreachableError  [launch.errors]
        ├── RemoteCommandError  [launch.errors]
        ├── BackendAPIError  [launch.errors]
        │   └── EngineUnreachableError  [launch.providers.docker.engine]
        └── LaunchNotFoundError  [launch.errors]
"""

from __future__ import annotations

import errno


class TraindError(Exception):
    """traind failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(TraindError):
    """The configuration is invalid."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s){where}:\n{lines}")


_MISSING = frozenset({"NoSuchKey", "NoSuchUpload", "NotFound", "404", "FX_NO_SUCH_FILE", "ENOENT"})
"""Codes saying the object, upload or file asked for is not there."""


class StorageError(TraindError):
    """The storage backend failed."""

    transient = False
    """Whether retrying may succeed: True for every TransientStorageError."""

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str = "",
        status: int | None = None,
        key: str | None = None,
        op: str = "",
    ) -> None:
        super().__init__(message)
        self.code = code
        """The store's name for the failure, "" if none: an S3 error code (``NoSuchKey``;
        ``404`` for a bodiless HEAD answer), an SFTP status (``FX_NO_SUCH_FILE``) or the errno
        of local file work (``ENOENT``)."""
        self.status = status
        """The HTTP status of the store's answer (S3), None without one."""
        self.key = key
        """The object key or path the operation was on, None for the whole store."""
        self.op = op
        """The operation that failed (``get_object``, ``upload /remote/path``, ``read``)."""

    @property
    def missing(self) -> bool:
        """Whether it failed because the object, upload or file is not there."""
        return self.code in _MISSING


class TransientStorageError(StorageError):
    """The storage backend failed in a way that may pass; the operation can be retried."""

    transient = True


def os_error(exc: OSError, action: str, path: object = None) -> StorageError:
    """The (not retried) StorageError for local file work that failed: ``cannot <action>
    <path>: <reason>``, the errno's name as its code (``path`` defaults to the OSError's)."""
    where = path if path is not None else exc.filename
    code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    at = "" if where is None else f" {where}"
    return StorageError(f"cannot {action}{at}: {exc.strerror or exc}", code=code,
                        key=None if where is None else str(where), op=action)


class NotFoundError(StorageError):
    """No such checkpoint in the store."""


class ContendedError(TransientStorageError):
    """Writers claimed one tag at the same instant on a store without atomic creates, and
    each withdrew: a later attempt, after a random pause, decides it."""

    def __init__(self, tag: str, ours: str, theirs: list[str], where: str = "") -> None:
        self.tag = tag
        self.ours = ours
        self.theirs = theirs
        at = f" in {where}" if where else ""
        super().__init__(
            f"{tag}{at}: writers {' and '.join([ours, *theirs])} claimed it at the same "
            "instant (this store has no atomic create, so claims are listed) and each "
            "withdrew"
        )


class IntegrityError(StorageError):
    """Data does not match its manifest (size or sha256)."""


class MissingFilesError(IntegrityError):
    """Files an upload reported stored are not in the store with their size: the manifest
    was not written, and those files are sent again."""

    def __init__(self, tag: str, paths: list[str], where: str = "") -> None:
        self.tag = tag
        self.paths = paths
        """The relative paths missing, or stored with another size."""
        shown = ", ".join(repr(p) for p in paths[:5]) + (", ..." if len(paths) > 5 else "")
        at = f" in {where}" if where else ""
        super().__init__(
            f"{tag}: {len(paths)} file(s) reported stored are not{at} with their size "
            f"({shown}); the manifest was not written"
        )


class LinkedPathError(StorageError):
    """A path in the store leads through a symbolic link (or a file where a directory
    belongs): traind writes nothing through it, and reads nothing through the run's own
    directory when that is one."""


class JournalError(TraindError):
    """The journal database (journal.sqlite3 in run.state_dir) failed."""

    def __init__(self, message: str, path: object, code: str = "") -> None:
        super().__init__(f"the journal {path}: {message}")
        self.path = path
        """The database file."""
        self.code = code
        """SQLite's name for the failure (``SQLITE_FULL``, ``SQLITE_IOERR_WRITE``), "" if none."""

    @property
    def full(self) -> bool:
        """Whether it failed for lack of space: SQLITE_FULL, or an I/O error (which is what a
        failed write of the WAL or its index reports)."""
        return self.code == "SQLITE_FULL" or self.code.startswith("SQLITE_IOERR")


class UnsafePathError(TraindError, ValueError):
    """A tag or relative path is not safe to use as a storage key."""


class CheckpointError(TraindError):
    """A checkpoint could not be taken in or committed as it is (not a store failure)."""


class SupervisorError(TraindError):
    """A supervised process could not be run."""

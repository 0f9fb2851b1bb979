"""Configuration: one TOML file, environment overrides, frozen models passed down.

Each component receives only its own section. ``load()`` is the only entry point; every
problem in a bad file is reported at once, naming the key, the value and what is allowed
(and the TRAIND_* variable, when the value came from the environment).
"""

from __future__ import annotations

import itertools
import os
import tomllib
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Self, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from traind.errors import ConfigError, TraindError
from traind.layout.keys import check_component
from traind.util import nodes, redact
from traind.util.address import DEFAULT_LISTEN, parse_listen
from traind.util.configfile import DEFAULT_CONFIG as DEFAULT_CONFIG
from traind.util.configfile import config_path as config_path
from traind.util.configfile import path_arg as path_arg
from traind.util.units import Duration, Floor, PositiveDuration, Size

ENV_PREFIX = "TRAIND_"


def _absolute(value: object) -> object:
    """Refuse an empty or relative directory before pydantic turns it into a Path: ``""``
    would be the working directory, and a relative path depends on it (``/`` under systemd)."""
    if isinstance(value, str | PurePath):
        if not str(value).strip():
            raise ValueError("must not be empty")
        if "\0" in str(value):
            raise ValueError("must not contain a NUL character")
        if not Path(value).is_absolute():
            raise ValueError("must be an absolute path (a relative one depends on the working "
                             "directory: / under systemd)")
    return value


Directory = Annotated[Path, BeforeValidator(_absolute)]
"""A directory traind writes in or deletes from: absolute, never empty."""


class Section(BaseModel):
    """Base of every config section: frozen, and unknown keys are errors (typos are caught)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class BackoffConfig(Section):
    """A section with capped exponential backoff (``traind.util.retry.Backoff``); each one
    sets its own defaults for the two keys."""

    backoff_initial: Duration
    backoff_max: Duration

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        # A first wait above its cap would silently make every wait the cap.
        if self.backoff_initial > self.backoff_max:
            raise ValueError(f"backoff_initial ({self.backoff_initial:g} s) is above "
                             f"backoff_max ({self.backoff_max:g} s)")
        return self


class RunConfig(Section):
    """``[run]``: what is being run and where its files live."""

    name: str = Field(description="remote namespace: <prefix>/<name>/<tag>/")
    output_dir: Directory = Field(description="where the trainer writes checkpoint-N/")
    state_dir: Directory = Path("/var/lib/traind")
    # On SIGTERM, once the trainer stopped (without [trainer]: once its saves settled),
    # the time to commit what it left.
    stop_timeout: Duration = 30.0
    # At start, restore the newest committed checkpoint when output_dir holds none.
    restore: bool = True
    nodes: int = Field(default=1, ge=1, description="hosts in the job, each running a traind")
    # This host, 0..nodes-1; None: from the scheduler's environment (traind.util.nodes).
    node_rank: int | None = Field(default=None, ge=0)
    # With nodes > 1: a checkpoint whose parts have not all arrived this long after the
    # newest one (a host died for good) is reported and deleted from the store by node 0.
    part_timeout: PositiveDuration = 6 * 3600.0
    # Nice levels the checkpoint transfers (their hashing, copying and sending threads, and
    # ssh/rsync) run below the daemon on Linux, so the trainer and vLLM it starts, which stay
    # at the daemon's priority, win the CPU while a checkpoint streams. 0: the same priority.
    transfer_nice: int = Field(default=10, ge=0, le=19)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return check_component(v, "run name")


class CheckpointsConfig(Section):
    """``[checkpoints]``: how complete checkpoint directories are recognised."""

    pattern: str = "checkpoint-*"
    markers: tuple[str, ...] = ("trainer_state.json", ".metadata")
    settle: Duration = 5.0
    poll_interval: PositiveDuration = 1.0
    force_polling: bool = False
    # Below this much free space on output_dir's filesystem, snapshots waiting for the
    # store whose checkpoint the trainer rotated away (or, its retention seen, deletes
    # before its next save) are dropped, oldest first; with no room for the next save even
    # then, only the newest is committed and the older ones waiting are dropped.
    min_free_space: Floor = "1.5x"


class LocalStorage(Section):
    """``[storage] type = "local"``: a directory, local disk or an NFS mount."""

    type: Literal["local"] = "local"
    path: Directory
    concurrency: int = Field(default=4, ge=1, le=64)
    # A claim not renewed for this long, its checkpoint uncommitted, is stale: its writer
    # died mid-upload, and another writer of the run takes the tag over (renewed every ttl/4).
    claim_ttl: PositiveDuration = Field(default=600.0, ge=1.0)


class S3Storage(Section):
    """``[storage] type = "s3"``: AWS S3 or any S3-compatible store."""

    type: Literal["s3"]
    client: Literal["aiobotocore", "obstore"] = "aiobotocore"
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: Literal["auto", "virtual", "path"] = "auto"
    profile: str | None = None
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    # Upload memory is bounded by upload_memory, by default concurrency x part_size (8 x 12
    # MiB = 96 MiB): a whole small file takes its size of it, a part part_size. Each part
    # costs a request's CPU (botocore's pipeline, a resume-state save): 12 MiB, not S3's
    # customary 8, spreads it over more bytes while the default stays within 100 MiB.
    part_size: Size = Field(default=12 * 1024**2, ge=5 * 1024**2, le=5 * 1024**3)
    concurrency: int = Field(default=8, ge=1, le=256)
    upload_memory: Size | None = Field(default=None, ge=1)
    max_bandwidth: Size | None = Field(default=None, ge=1)
    request_checksum_calculation: Literal["when_supported", "when_required"] = "when_supported"
    retries: int = Field(default=8, ge=0)
    retry_max_delay: Duration = 20.0
    connect_timeout: PositiveDuration = 10.0
    read_timeout: PositiveDuration = 60.0
    # A claim not renewed for this long, its checkpoint uncommitted, is stale: its writer
    # died mid-upload, and another writer of the run takes the tag over (renewed every ttl/4).
    claim_ttl: PositiveDuration = Field(default=600.0, ge=1.0)

    @field_validator("prefix")
    @classmethod
    def _safe_prefix(cls, v: str) -> str:
        v = v.strip("/")
        for part in v.split("/") if v else ():
            check_component(part, "prefix component")
        return v

    @field_validator("endpoint_url")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        # Every request is signed with the keys: aiohttp refuses a URL's user and password
        # beside the signature, so such an endpoint would fail every request.
        if v is not None and "@" in urlsplit(v).netloc:
            raise ValueError("must not hold a user or password: S3 requests are signed with "
                             "access_key_id and secret_access_key (or profile)")
        return v


class SSHStorage(BackoffConfig):
    """``[storage] type = "ssh"``: a host reachable over SSH (SFTP, or rsync)."""

    type: Literal["ssh"]
    host: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    identity_file: Path | None = None
    known_hosts: Path | None = None
    insecure_skip_host_key_check: bool = False
    remote_path: str
    concurrency: int = Field(default=4, ge=1, le=64)
    keepalive: PositiveDuration = 15.0
    transfer: Literal["sftp", "openssh", "rsync"] = "sftp"
    connect_timeout: PositiveDuration = 30.0
    retries: int = Field(default=8, ge=0, description="reconnects per operation, then fail")
    backoff_initial: Duration = 0.5
    backoff_max: Duration = 30.0
    # A claim not renewed for this long, its checkpoint uncommitted, is stale: its writer
    # died mid-upload, and another writer of the run takes the tag over (renewed every ttl/4).
    claim_ttl: PositiveDuration = Field(default=600.0, ge=1.0)

    @field_validator("host", "user")
    @classmethod
    def _no_option_lookalike(cls, v: str | None) -> str | None:
        # Both end up as ssh/rsync arguments: a leading "-" would be read as an option.
        if v is not None and (not v or v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError("must be non-empty, must not start with '-' or contain spaces")
        return v

    @field_validator("remote_path")
    @classmethod
    def _usable_remote_path(cls, v: str) -> str:
        if not v.strip() or "\0" in v:
            raise ValueError("must be a non-empty path on the remote host")
        return v


class HFStorage(Section):
    """``[storage] type = "hf"``: a model or dataset repo on the Hugging Face Hub (or a
    self-hosted one at ``endpoint``), one Hub commit per stored change."""

    type: Literal["hf"]
    repo_id: str
    repo_type: Literal["model", "dataset"] = "model"
    revision: str = "main"
    path_in_repo: str = ""
    endpoint: str | None = None
    # None: HF_TOKEN, else the library's token file (``hf auth login``). Never logged, and
    # HF_TOKEN is dropped from every child's environment.
    token: SecretStr | None = None
    # Create the repo, and the branch ``revision`` (from the default branch), when missing.
    create_repo: bool = False
    private: bool = True
    # The Hub allows about 128 commits an hour per repo: while a newer checkpoint waits, an
    # older one that retention would not pin (keep_every_steps) is skipped, not committed.
    coalesce: bool = True
    concurrency: int = Field(default=4, ge=1, le=64)
    # Not used: on the Hub a checkpoint's one commit is its claim, so no lease is kept (a
    # writer that died mid-upload made no commit); kept so one config serves every store.
    claim_ttl: PositiveDuration = Field(default=600.0, ge=1.0)

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, v: str) -> str:
        parts = v.split("/")
        if len(parts) != 2:
            raise ValueError("must be <namespace>/<name>")
        for part in parts:
            check_component(part, "repo_id component")
        return v

    @field_validator("path_in_repo")
    @classmethod
    def _safe_path(cls, v: str) -> str:
        v = v.strip("/")
        for part in v.split("/") if v else ():
            check_component(part, "path_in_repo component")
        return v


AnyStorage = LocalStorage | S3Storage | SSHStorage | HFStorage
"""Any one ``[storage]`` section."""
StorageConfig = Annotated[AnyStorage, Field(discriminator="type")]
STORAGE_TYPES: tuple[str, ...] = tuple(
    get_args(model.model_fields["type"].annotation)[0]
    for model in get_args(get_args(StorageConfig)[0])
)
"""The ``[storage] type`` values, read from the union's models (for error messages)."""


class RetentionConfig(Section):
    """``[retention]``: which committed checkpoints to keep, remotely and locally."""

    keep_last: int = Field(default=5, ge=1)
    keep_every_steps: int | None = Field(default=None, ge=1)
    keep_best: bool = True
    keep_local: int | None = Field(default=2, ge=1)
    interval: PositiveDuration = 600.0


class StatusConfig(Section):
    """``[status]``: the local status server."""

    listen: str = DEFAULT_LISTEN
    enabled: bool = True

    @field_validator("listen")
    @classmethod
    def _address(cls, v: str) -> str:
        parse_listen(v)
        return v


class HealthConfig(Section):
    """An HTTP health check: ready after ``successes`` 200s in a row within ``ready_timeout``."""

    url: str
    interval: PositiveDuration = 2.0
    timeout: PositiveDuration = 5.0
    successes: int = Field(default=2, ge=1)
    failures: int = Field(default=3, ge=1)
    ready_timeout: PositiveDuration = 900.0


class RestartConfig(BackoffConfig):
    """When and how fast a child is restarted (a backoff of 0 restarts at once; a window or
    stable_after of 0 would switch the max_restarts limit off, so they must be positive)."""

    policy: Literal["always", "on-failure", "never"] = "on-failure"
    backoff_initial: Duration = 2.0
    backoff_max: Duration = 300.0
    max_restarts: int = Field(default=5, ge=0)
    window: PositiveDuration = 3600.0
    stable_after: PositiveDuration = 600.0


class ChildConfig(Section):
    """What every supervised child has: a command, its environment and stop behaviour."""

    command: tuple[str, ...] = Field(min_length=1)
    cwd: Path | None = None
    env: dict[str, str] = Field(default_factory=dict)
    gpus: tuple[int, ...] | None = None
    restart: RestartConfig = RestartConfig()
    stop_grace: Duration = 30.0
    log_max_bytes: Size = 64 * 1024**2  # <state_dir>/logs/<name>.log rotates at this size
    log_backups: int = Field(default=3, ge=0)  # rotated log files kept


class ServiceConfig(ChildConfig):
    """``[[services]]``: a helper server the trainer needs."""

    name: str
    health: HealthConfig | None = None

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return check_component(v, "service name")


class VLLMHealthConfig(HealthConfig):
    """vLLM's health check, plus hang detection from its ``/metrics``: requests running or
    waiting and no token generated for ``stall_timeout`` is a hang (None: not checked)."""

    stall_timeout: PositiveDuration | None = 300.0


class VLLMConfig(ChildConfig):
    """``[vllm]``: the vLLM server (``vllm serve`` or ``trl vllm-serve``)."""

    health: VLLMHealthConfig
    # after a trainer restart: "auto" restarts vLLM's own server (its NCCL weight-transfer
    # group is stale) and POSTs /close_communicator/ to the old ``trl vllm-serve`` server
    on_trainer_restart: Literal["auto", "close-communicator", "restart", "nothing"] = "auto"
    release_timeout: Duration = 120.0  # before a restart: wait this long for port and GPUs to free


class TrainerConfig(ChildConfig):
    """``[trainer]``: the training command."""

    progress_timeout: PositiveDuration | None = 1800.0  # None: no hang detection
    first_progress_timeout: PositiveDuration | None = 3600.0
    distributed: bool = False
    exit_when_done: bool = True  # after the trainer exits 0 and every checkpoint is committed
    # after the trainer is given up on (FATAL, or not restarted) and every checkpoint is
    # committed, traind exits with the trainer's exit status: a container's job then ends
    exit_when_failed: bool = False


class _NotJSONError(TraindError, ValueError):
    """An environment override of a list or table whose value is not JSON."""


class _EnvSource(EnvSettingsSource):
    """TRAIND_* overrides, as pydantic-settings reads them, except that a list or table that
    is not JSON is reported with the variable's name instead of as a bare parse failure."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError as exc:
            name = self._variable(field_name, value)
            # A table ([storage], a child's env) may hold secrets: only a list is shown.
            table = any(get_origin(k) is dict or (isinstance(k, type) and issubclass(k, BaseModel))
                        for k in _kinds(field.annotation))
            shown = "(a table: its value is not shown)" if table else redact.text(repr(value))
            raise _NotJSONError(
                f"${name} = {shown}: not JSON; a list or table from the environment is "
                'written as JSON, e.g. ["python", "train.py"] or {"KEY": "value"}'
            ) from exc

    def _variable(self, key: str, value: str) -> str:
        """The variable holding ``value`` for ``key``: pydantic-settings passes only the last
        part of a nested name (``markers`` for TRAIND_CHECKPOINTS__MARKERS)."""
        names = (name.upper() for name, held in self.env_vars.items() if held == value)
        suffix = f"_{key.upper()}"
        return next(
            (n for n in names if n.startswith(ENV_PREFIX) and n.endswith(suffix)),
            ENV_PREFIX + key.upper(),
        )


class Settings(BaseSettings):
    """The whole configuration file."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    run: RunConfig
    checkpoints: CheckpointsConfig = CheckpointsConfig()
    storage: StorageConfig
    retention: RetentionConfig = RetentionConfig()
    status: StatusConfig = StatusConfig()
    vllm: VLLMConfig | None = None
    services: tuple[ServiceConfig, ...] = ()
    trainer: TrainerConfig | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides the file, which arrives as init arguments.
        return _EnvSource(settings_cls), init_settings


def load(path: Path) -> Settings:
    """Read, merge with the environment and validate; raise ConfigError listing every problem."""
    return validate(read_toml(path), str(path))


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``, parsed; ConfigError if it is missing, unreadable, not
    UTF-8 (which TOML requires) or not TOML."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError([f"config file not found: {path}"], str(path)) from exc
    except OSError as exc:
        raise ConfigError([f"cannot read config file: {exc}"], str(path)) from exc
    try:
        return tomllib.loads(raw.decode())
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        problem = (
            f"not UTF-8 text, as TOML must be: byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start} (line {line})"
        )
        raise ConfigError([problem], str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"], str(path)) from exc


def validate(data: dict[str, Any], source: str = "") -> Settings:
    """Validate already-parsed config data (plus environment overrides)."""
    misnamed = _unknown_env_sections()
    try:
        settings = Settings(**data)
    except SettingsError as exc:  # an override that could not even be parsed
        raise ConfigError([str(exc.__cause__ or exc)], source) from exc
    except ValidationError as exc:
        problems = [_describe(err) for err in exc.errors()]
        if "backend" in data and "storage" not in data:  # its every key would be a problem
            problems = ["this is a `traind launch` file (top-level `backend`, no [storage]): "
                        "use it with `traind launch -c`; traind's own config is the file its "
                        "[run] traind_config names"]
        raise ConfigError(misnamed + problems, source) from exc
    problems = misnamed + _overlaps(settings) + _rank_problems(settings)
    if problems:
        raise ConfigError(problems, source)
    return settings


def _unknown_env_sections() -> list[str]:
    """TRAIND_<SECTION>__<KEY> variables naming no section: pydantic-settings would ignore
    them, so a typo (TRAIND_RETENTON__KEEP_LAST) would silently change nothing."""
    sections = list(Settings.model_fields)
    problems = []
    for name in sorted(os.environ):
        head, sep, _ = name.upper().removeprefix(ENV_PREFIX).partition("__")
        if name.upper().startswith(ENV_PREFIX) and sep and head.lower() not in sections:
            problems.append(f"${name}: no section {head.lower()!r} to override (sections: "
                            f"{', '.join(sections)})")
    return problems


def _overlaps(settings: Settings) -> list[str]:
    """Problems with output_dir, state_dir and a local store sharing a directory: retention
    deletes in output_dir and in the store, the watcher uploads what appears in output_dir,
    and state_dir holds the journal and staging, so none may be inside another."""
    written = {"run.output_dir": settings.run.output_dir, "run.state_dir": settings.run.state_dir}
    if isinstance(settings.storage, LocalStorage):
        written["storage.path"] = settings.storage.path
    real = {key: Path(os.path.realpath(path)) for key, path in written.items()}

    def shown(key: str) -> str:
        resolved = "" if real[key] == written[key] else f" (resolved: {real[key]})"
        return f"{key}{_origin(key.split('.'))} = '{written[key]}'{resolved}"

    problems = []
    for a, b in itertools.combinations(written, 2):
        relation = _relation(real[a], real[b])
        if relation:
            problems.append(
                f"{shown(a)} {relation} {shown(b)}: they must be separate directories, "
                "neither inside the other"
            )
    return problems


def _rank_problems(settings: Settings) -> list[str]:
    """A job of several hosts whose rank for this one is missing or out of range: two hosts
    taking one rank, or none, would mix or lose their parts of every checkpoint."""
    try:
        node_rank(settings)
    except nodes.RankError as exc:
        return [str(exc)]
    return []


def node_rank(settings: Settings) -> nodes.NodeRank:
    """This host's rank in the job (``[run] node_rank``, else the scheduler's environment);
    RankError when there is none."""
    return nodes.resolve(settings.run.nodes, settings.run.node_rank, os.environ)


def _relation(a: Path, b: Path) -> str | None:
    """How directory ``a`` overlaps ``b``, in words, or None when they are apart."""
    if a == b:
        return "is the same directory as"
    if a.is_relative_to(b):
        return "is inside"
    if b.is_relative_to(a):
        return "contains"
    return None


def _describe(err: Any) -> str:
    parts = _location(err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        parts.append("type")  # the discriminator: say which key it is
    loc = ".".join(parts) + _origin(parts)
    msg = str(err["msg"]).removeprefix("Value error, ")
    allowed = ", ".join(STORAGE_TYPES)
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    if err["type"] == "union_tag_not_found":
        return f"{loc}: required key is missing; one of {allowed}"
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key (check the spelling; see config/ for every key)"
    if err["type"] == "union_tag_invalid":
        got = err["input"].get("type") if isinstance(err["input"], dict) else err["input"]
        return f"{loc} = {got!r}: not a storage type; allowed: {allowed}"
    value = err.get("input")
    if _secret(parts):
        return f"{loc} = {redact.MASK} (a secret: its value is not shown): {msg}"
    if isinstance(value, dict):
        return redact.text(f"{loc}: {msg}")
    return redact.text(f"{loc} = {value!r}: {msg.removeprefix(f'{value!r}: ')}")  # value once


def _secret_keys(model: type[BaseModel]) -> frozenset[str]:
    """The keys, anywhere in ``model``'s sections, whose value is a ``SecretStr``."""
    found: set[str] = set()
    for name, field in model.model_fields.items():
        for kind in _kinds(field.annotation):
            if kind is SecretStr:
                found.add(name)
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                found |= _secret_keys(kind)
    return frozenset(found)


def _kinds(annotation: Any) -> list[Any]:
    """``annotation`` and every type inside it (``SecretStr | None`` → both, and None)."""
    return [annotation, *(k for arg in get_args(annotation) for k in _kinds(arg))]


def _secret(parts: list[str]) -> bool:
    """Whether the key at ``parts`` holds a secret: a ``SecretStr`` key (storage keys and
    tokens), a child's environment variable named like one (``env.HF_TOKEN``), or a table
    holding them given as one value (``$TRAIND_STORAGE``, ``env = "HF_TOKEN=..."``)."""
    if parts and parts[-1] in SECRET_KEYS | SECRET_TABLES:
        return True
    return len(parts) > 1 and parts[-2] == "env" and redact.secret_name(parts[-1])


SECRET_KEYS = _secret_keys(Settings)
"""Keys whose value no message shows (``secret_access_key``, ``token``)."""
SECRET_TABLES = frozenset({"storage", "env"})
"""Tables holding secrets (``SECRET_KEYS``, a child's tokens): nor is their value shown."""


def _location(loc: tuple[Any, ...]) -> list[str]:
    """The key's path as written in the file: ``storage.s3.bucket`` (pydantic names the
    union member it tried) is ``storage.bucket``; a top-level ``ssh`` stays ``ssh``."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "storage" and parts[1] in STORAGE_TYPES:
        del parts[1]
    return parts


def _origin(parts: list[str]) -> str:
    """`` (from $TRAIND_X__Y)`` when a TRAIND_* variable set this key or the section holding
    it (the environment overrides the file), else nothing."""
    names = {name.upper(): name for name in os.environ}  # matched case-insensitively
    for end in range(len(parts), 0, -1):
        name = ENV_PREFIX + "__".join(parts[:end]).upper()
        if name in names:
            return f" (from ${names[name]})"
    return ""

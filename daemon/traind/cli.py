"""The ``traind`` command line: run the daemon, check config, list, pull, verify, push,
prune."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from traind import __version__
from traind.errors import ConfigError, JournalError, TraindError
from traind.util import logs, redact
from traind.util.configfile import DEFAULT_CONFIG, config_path, path_arg
from traind.util.runtime import long_lived

if TYPE_CHECKING:
    from structlog.typing import Processor

    from traind.config import Settings
    from traind.layout.manifest import Manifest
    from traind.protocol import CheckpointStore

EXAMPLES = {
    "run": "examples:\n  traind run -c /etc/traind/traind.toml\n"
    "  traind run --no-restore   # watch and stream only: an empty output_dir stays empty",
    "check-config": "example:\n  traind check-config -c config/local.toml\n"
    "  traind check-config -c config/s3.toml --offline   # skip the store probe",
    "list": "example:\n  traind list -c /etc/traind/traind.toml\n  traind list --json | jq '.[0]'",
    "pull": "examples:\n  traind pull latest ./restore            # → ./restore/checkpoint-N\n"
    "  traind pull checkpoint-400 /data/out\n"
    "  traind pull --dry-run latest ./restore  # what would be fetched; fetch nothing\n\n"
    "'latest' passes over a corrupt newest checkpoint to the newest that verifies, and\n"
    "says so on stderr; a named TAG that does not verify is refused (exit status 1).",
    "verify": "examples:\n  traind verify                           # every checkpoint (as --all)\n"
    "  traind verify checkpoint-400\n  traind verify latest\n\n"
    "Each file is read back through the store's normal download into a scratch file in\n"
    "run.state_dir (else $TMPDIR), removed once hashed: it needs free space for the\n"
    "largest file only. Exit status: 0 when everything matches, 1 when any file is\n"
    "missing or differs (or the store cannot be read).\n\n"
    "Where run.state_dir holds a journal, what is found is recorded there: a checkpoint\n"
    "found corrupt is passed over by restores without being downloaded, and one that\n"
    "verifies again (repaired in the store) is restored again.",
    "push": "examples:\n  traind push /data/out/checkpoint-400\n"
    "  traind push --dry-run /data/out/checkpoint-400   # what would be sent; send nothing",
    "prune": "examples:\n  traind prune --dry-run                  # show what would go, and why\n"
    "  traind prune",
    "status": "examples:\n  traind status\n  traind status --watch        # redraw every 2 s\n"
    "  traind status --json | jq .upload\n"
    "  traind status --socket /run/traind/status.sock   # without reading the config\n\n"
    "When the config file is invalid (a bad edit), the daemon is found at the address it\n"
    "published in run.state_dir/status.address, else at the file's status.listen, else at\n"
    "the default.",
}

Handler = Callable[[argparse.Namespace], int | Coroutine[Any, Any, int]]
"""A command: its exit status, or a coroutine to run in an event loop for it (only the
commands that need one import asyncio)."""

LAUNCH_SUMMARY = "Rent or reach a GPU host, run traind there, bring checkpoints back, tear down."
"""``launch``'s line in ``traind --help`` when its parser is not built (as launch.cli words it)."""

LEVELS = ("debug", "info", "warning", "error", "critical")

EXIT_UNSTORED = 75
"""``traind run`` stopped (SIGTERM) before every checkpoint was committed: the ones not in
the store are named in its last log line (EX_TEMPFAIL: a restart on this host commits them).
0 means everything was stored, 1 a failure, 2 an invalid configuration; under ``[trainer]
exit_when_failed``, the status of a trainer given up on."""


def _seconds_arg(value: str) -> float:
    """``--watch``'s value: a positive, finite number of seconds (0 or nan would spin)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: must be a number of seconds above 0")
    return seconds


def _status_url(value: str) -> str:
    """``--url``'s value as a status.listen address: ``http://HOST:PORT`` or ``HOST:PORT``."""
    from urllib.parse import urlsplit

    from traind.util.address import parse_listen

    parts = urlsplit(value if "://" in value else f"http://{value}")
    shown = redact.url(value)
    try:
        if parts.scheme != "http" or parts.path not in ("", "/", "/status"):
            raise ValueError(f"{shown!r}: write http://HOST:PORT, e.g. http://127.0.0.1:9750")
        if "@" in parts.netloc:
            raise ValueError(f"{shown!r}: the status server takes no user or password")
        parse_listen(parts.netloc)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return parts.netloc


def build_parser(launching: bool = True) -> argparse.ArgumentParser:
    """The argument parser with every subcommand; without ``launching`` it knows ``launch``
    by name only, which spares the launch package's imports to every other command."""
    parser = argparse.ArgumentParser(
        prog="traind",
        description="Supervise a training run and stream its checkpoints to storage, verifiably.",
        epilog="The config file is TOML (see config/ for commented examples). "
        "Any key can be overridden from the environment: TRAIND_<SECTION>__<KEY>, "
        "e.g. TRAIND_RETENTION__KEEP_LAST=3.",
    )
    parser.add_argument("--version", action="version", version=f"traind {__version__}")
    _add_global_options(parser, None)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, argparse.SUPPRESS)  # keeps what was given before COMMAND
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            parents=[common],
            help=summary,
            description=summary,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    run = add("run", "Run the daemon: restore on a fresh host, then watch, stream and prune.")
    run.add_argument("--no-restore", action="store_true",
                     help="do not restore into an empty output_dir at start (as run.restore "
                          "= false)")
    check = add("check-config", "Validate the config file and probe the storage backend.")
    check.add_argument("--offline", action="store_true", help="validate only; do not probe")
    check.add_argument(
        "--timeout", type=_seconds_arg, default=60.0, metavar="SECONDS",
        help="give up probing the store after this long (default 60; a store that accepts "
             "connections but never answers would otherwise take every retry's read_timeout)",
    )
    _add_store_commands(add)
    _add_status(add("status", "Show the running daemon: children, queue, upload, checkpoints, "
                           "errors."))
    if launching:
        from traind.launch.commands.cli import add_launch_parser

        add_launch_parser(sub)
    else:
        sub.add_parser("launch", help=LAUNCH_SUMMARY)
    return parser


def _add_store_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """The commands that work on the store: list, pull, verify, push, prune."""
    lst = add("list", "List the committed checkpoints in the store.")
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pull = add("pull", "Restore a committed checkpoint into DIR/<tag>, verified.")
    pull.add_argument("tag", metavar="TAG", help="a tag such as checkpoint-400, or 'latest'")
    pull.add_argument("dir", metavar="DIR", type=Path, help="parent directory to restore into")
    pull.add_argument("--dry-run", action="store_true",
                      help="say what would be fetched, and its size; download nothing")
    verify = add("verify", "Check the store against the manifests: every file's size and sha256.")
    which = verify.add_mutually_exclusive_group()
    which.add_argument("tag", metavar="TAG", nargs="?",
                       help="a tag such as checkpoint-400, or 'latest' (default: all)")
    which.add_argument("--all", action="store_true", help="every committed checkpoint")
    push = add("push", "Commit one checkpoint directory to the store by hand.")
    push.add_argument("dir", metavar="DIR", type=Path, help="the checkpoint-N directory")
    push.add_argument("--tag", help="tag to store it under (default: the directory name)")
    push.add_argument("--dry-run", action="store_true",
                      help="say what would be sent, and its size; upload nothing")
    prune = add("prune", "Apply the retention policy to the store and to output_dir now.")
    prune.add_argument("--dry-run", action="store_true", help="show what would go, and why")


def _add_status(status: argparse.ArgumentParser) -> None:
    """``traind status``'s options."""
    status.add_argument("--json", action="store_true", help="print the raw JSON document")
    reach = status.add_mutually_exclusive_group()
    reach.add_argument("--url", type=_status_url, metavar="URL",
                       help="the daemon's status server, http://HOST:PORT (default: status.listen)")
    reach.add_argument("--socket", type=Path, metavar="PATH",
                       help="the daemon's status unix socket (default: status.listen)")
    status.add_argument(
        "--watch",
        nargs="?",
        type=_seconds_arg,
        const=2.0,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )


def _add_global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """The options accepted both before and after COMMAND (``default`` SUPPRESS after it, so
    an option given only before COMMAND is not reset)."""
    parser.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        type=path_arg,
        default=default,
        help=f"config file (default: $TRAIND_CONFIG or {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--log-level", choices=LEVELS, type=str.lower, default=default,
        help="least severe log event shown (default info; -q: error, -v: debug)",
    )
    parser.add_argument(
        "--log-format", choices=logs.FORMATS, default=default,
        help="log lines as JSON or for people (default: console on a terminal, else json)",
    )
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", default=default,
                          help="log errors only")
    loudness.add_argument("-v", "--verbose", action="store_true", default=default,
                          help="log debug events too")


def configure_logs(
    args: argparse.Namespace, stream: TextIO, processors: Sequence[Processor] = ()
) -> None:
    """Configure logging to ``stream`` as the global options in ``args`` ask."""
    level = args.log_level or ("error" if args.quiet else "debug" if args.verbose else "info")
    as_json = None if args.log_format is None else args.log_format == "json"
    logs.configure(stream, json=as_json, level=level, processors=processors)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``traind`` console script."""
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(launching="launch" in words).parse_args(words)
    if args.command != "status":  # it logs nothing: structlog stays unimported
        configure_logs(args, sys.stdout if args.command == "run" else sys.stderr)
    handler: Handler = _HANDLERS[args.command]
    try:
        result = handler(args)
        if isinstance(result, int):
            return result
        import asyncio

        return asyncio.run(result)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        failures = _leaves(exc)  # `traind run` fails from inside a TaskGroup
        if not all(_expected(e) for e in failures):
            raise  # a bug: keep its traceback
        for failure in failures:
            print(f"traind: {redact.text(_explain(failure, args.command))}", file=sys.stderr)
        return 2 if all(isinstance(e, ConfigError) for e in failures) else 1


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, exception groups flattened."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _expected(exc: BaseException) -> bool:
    """Whether ``exc`` is an ordinary failure to report in one line: traind's own errors
    (a journal that cannot be used among them), or an error the OS reported (it has an
    errno)."""
    return isinstance(exc, TraindError) or (isinstance(exc, OSError) and exc.errno is not None)


def _explain(exc: BaseException, command: str) -> str:
    """The one line that says what failed, for an ``_expected`` exception."""
    if isinstance(exc, ConfigError):
        return f"invalid configuration {exc}"
    if isinstance(exc, OSError):
        paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
        where = f"{paths}: " if paths else ""
        return f"{command} failed: {where}{exc.strerror or exc}"
    if isinstance(exc, JournalError):
        return f"{command} failed: {exc}"
    return str(exc)


def _settings(args: argparse.Namespace) -> Settings:
    from traind import config

    return config.load(config_path(args.config))


async def _run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from traind import config
    from traind.app.daemon import Daemon
    from traind.status.model import RecentErrors
    from traind.util.proc import priority

    path = config_path(args.config)
    settings = config.load(path)
    recent = RecentErrors()
    configure_logs(args, sys.stdout, processors=[recent.processor])
    stop, reload = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    if priority.lower_transfers(settings.run.transfer_nice) is not None:
        await priority.lower_session()
        loop.set_default_executor(priority.executor())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    daemon = await Daemon.open(settings, config_path=path, recent=recent,
                               restore=not args.no_restore)
    await daemon.run(stop, reload)
    if daemon.failed_with is not None:
        return daemon.failed_with
    return EXIT_UNSTORED if daemon.unstored else 0


def _status(args: argparse.Namespace) -> int:
    from traind.status.client import DaemonUnreachableError, fetch_status, status_command
    from traind.status.locate import locate, named

    if args.url or args.socket:
        listen = args.url or f"unix:{args.socket.absolute()}"
        return status_command(listen, args.json, args.watch)
    path = config_path(args.config)
    if (listen := named(path)) is not None:  # found there, the file need not be validated
        try:
            first = fetch_status(listen)
        except DaemonUnreachableError:
            pass  # the file may be a bad edit the daemon never read: validate it, look further
        else:
            return status_command(listen, args.json, args.watch, first=first)
    from traind import config

    try:
        listen = config.load(path).status.listen
    except ConfigError as exc:  # a bad edit must not hide the daemon still running
        listen, origin = locate(path)
        print(f"traind: {path} is not a valid config ({len(exc.problems)} problem(s): "
              f"traind check-config -c {path}); asking {listen}, {origin}", file=sys.stderr)
        return status_command(listen, args.json, args.watch, found=origin)
    return status_command(listen, args.json, args.watch)


async def _check_config(args: argparse.Namespace) -> int:
    import asyncio

    from traind import config
    from traind.protocol import open_storage

    path = config_path(args.config)
    settings = config.load(path)
    print(f"{path}: valid (run {settings.run.name}, storage {settings.storage.type})")
    if args.offline:
        return 0
    storage = open_storage(settings.storage, settings.run.name)
    try:
        async with asyncio.timeout(args.timeout):
            claim = await storage.probe()
    except TimeoutError:
        raise TraindError(
            f"storage {storage.describe}: no complete answer within {args.timeout:g} s; check "
            "the endpoint or host (something there accepts connections but does not answer)"
        ) from None
    finally:
        await storage.aclose()
    print(f"storage {storage.describe}: reachable and writable")
    print(f"storage {storage.describe}: checkpoint ownership by {claim}")
    return 0


async def _list(args: argparse.Namespace) -> int:
    from traind.protocol import open_storage

    settings = _settings(args)
    storage = open_storage(settings.storage, settings.run.name)
    try:
        manifests = sorted(await _pullable(storage), key=lambda m: m.step)
    finally:
        await storage.aclose()
    if args.json:
        from traind.util.jsontext import strict_json

        rows = [
            {
                "tag": m.tag,
                "step": m.step,
                "files": len(m.files),
                "bytes": m.total_bytes,
                "created_at": m.created_at,
                "host": m.host,
                "global_step": m.trainer.global_step,
            }
            for m in manifests
        ]
        print(strict_json(rows, indent=2))
        return 0
    import time

    from traind.util.units import format_size

    now = time.time()
    table = [("TAG", "STEP", "FILES", "SIZE", "AGE", "HOST")] + [
        (
            m.tag,
            str(m.step),
            str(len(m.files)),
            format_size(m.total_bytes),
            _age(now - m.created_at),
            m.host,
        )
        for m in manifests
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if not manifests:
        print(f"(no committed checkpoints in {storage.describe})")
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


async def _pull(args: argparse.Namespace) -> int:
    from traind.checkpoints.restore.download import find, restore, restore_newest
    from traind.errors import IntegrityError
    from traind.protocol import open_storage
    from traind.util.progress import Progress, shown

    settings = _settings(args)
    storage = open_storage(settings.storage, settings.run.name)
    if args.dry_run:
        try:
            manifest = await find(storage, args.tag, await _pullable(storage))
        finally:
            await storage.aclose()
        return _show_pull_plan(manifest, args.dir, storage.describe)

    async def attempt(manifest: Manifest) -> Path:
        async with shown(Progress(manifest.total_bytes), f"pull {manifest.tag}") as progress:
            return await restore(storage, manifest, args.dir, progress)

    try:
        manifests = await _pullable(storage)
        manifest = await find(storage, args.tag, manifests)
        if args.tag != "latest":
            dest = await attempt(manifest)
        else:
            restored = await restore_newest(storage, manifests, args.dir, None, attempt)
            if restored is None:
                raise IntegrityError(
                    f"no committed checkpoint in {storage.describe} verifies "
                    f"({len(manifests)} tried; see traind verify --all)"
                )
            if restored.tag != manifest.tag:
                print(f"traind: {manifest.tag} (latest) is corrupt in the store; pulled "
                      f"{restored.tag}, the newest that verifies", file=sys.stderr)
            dest = args.dir / restored.tag
    finally:
        await storage.aclose()
    print(dest)
    return 0


async def _pullable(storage: CheckpointStore) -> list[Manifest]:
    """The committed checkpoints, and those HF Trainer pushed itself to the same repo. The
    store's client is made by then: ``long_lived`` keeps the GC from rescanning it."""
    found = await storage.manifests() + await storage.foreign_manifests()
    long_lived()
    return found


def _show_pull_plan(manifest: Manifest, parent: Path, backend: str) -> int:
    """Print what ``pull --dry-run`` would fetch; refuse a destination a pull would refuse."""
    from traind.util.units import format_size

    dest = parent / manifest.tag
    if dest.exists():
        raise TraindError(f"{dest} already exists; a pull would refuse to overwrite it")
    print(f"would fetch {manifest.tag} from {backend} into {dest}: {len(manifest.files)} "
          f"files, {format_size(manifest.total_bytes)} (verified on arrival)")
    _show_files([(f.path, f.size) for f in manifest.files])
    return 0


def _show_files(files: Sequence[tuple[str, int]]) -> None:
    """One line per file: its size, human, then its relative path."""
    from traind.util.units import format_size

    for path, size in files:
        print(f"  {format_size(size):>10}  {path}")


async def _verify(args: argparse.Namespace) -> int:
    import tempfile

    from traind.checkpoints.restore.download import find
    from traind.checkpoints.restore.verify import check, remember
    from traind.checkpoints.state.identity import RunIdentity
    from traind.checkpoints.state.journal import Journal
    from traind.errors import IntegrityError, StorageError
    from traind.layout.manifest import Unreadable
    from traind.protocol import open_storage
    from traind.util.units import format_size

    settings = _settings(args)
    storage = open_storage(settings.storage, settings.run.name)
    scratch, journal = settings.run.state_dir, None
    if not (scratch.is_dir() and os.access(scratch, os.W_OK)):  # not this host's, or not ours
        scratch = Path(tempfile.gettempdir())
    elif (scratch / "journal.sqlite3").is_file():
        journal = Journal.in_state_dir(scratch, RunIdentity.of(settings))
    unreadable: list[Unreadable] = []
    try:
        if args.tag is None:
            listing = await storage.listing()
            manifests = sorted(listing.manifests, key=lambda m: m.step)
            unreadable = listing.unreadable
        else:
            manifests = [await find(storage, args.tag)]
        bad = 0
        for manifest in manifests:
            size = f"{len(manifest.files)} files, {format_size(manifest.total_bytes)}"
            try:
                report = await check(storage, manifest, scratch)
            except StorageError as exc:
                if exc.key is None and not isinstance(exc, IntegrityError):
                    raise  # the store failed, not this checkpoint: nothing more is checked
                bad += 1
                print(f"{manifest.tag}: cannot be read from the store ({size})\n  {exc}")
                continue
            if journal is not None:
                await remember(journal, report)
            if report.ok:
                print(f"{manifest.tag}: OK ({size})")
                continue
            bad += 1
            print(f"{manifest.tag}: {len(report.problems)} of {len(manifest.files)} files "
                  f"do not match ({size})")
            for problem in report.problems:
                print(f"  {problem}")
    finally:
        await storage.aclose()
        if journal is not None:
            journal.close()
    for refused in unreadable:
        print(f"{refused.where}: unreadable manifest\n  {refused.error}")
    if not manifests and not unreadable:
        print(f"(no committed checkpoints in {storage.describe})")
    print(f"{len(manifests) + len(unreadable)} checkpoint(s) checked in {storage.describe}: "
          f"{len(manifests) - bad} OK, {bad + len(unreadable)} with problems")
    return 1 if bad or unreadable else 0


async def _push(args: argparse.Namespace) -> int:
    from traind.checkpoints.commit.push import plan, push
    from traind.util.units import format_size

    settings = _settings(args)
    if args.dry_run:
        planned = await plan(settings, args.dir, args.tag)
        print(f"would push {args.dir} as {planned.tag} to {planned.backend}: "
              f"{len(planned.files)} files, {format_size(planned.total_bytes)}")
        _show_files(planned.files)
        return 0
    manifest = await push(settings, args.dir, args.tag)
    print(f"{manifest.tag}: committed ({len(manifest.files)} files, "
          f"{format_size(manifest.total_bytes)})")
    return 0


async def _launch(args: argparse.Namespace) -> int:
    from traind.launch.commands.cli import handle

    return await handle(args)


async def _prune(args: argparse.Namespace) -> int:
    from traind.checkpoints.retention import pruner
    from traind.checkpoints.state.identity import RunIdentity
    from traind.checkpoints.state.journal import Journal
    from traind.protocol import open_storage

    settings = _settings(args)
    storage = open_storage(settings.storage, settings.run.name)
    journal = Journal.in_state_dir(settings.run.state_dir, RunIdentity.of(settings))
    act = pruner.plan if args.dry_run else pruner.prune
    try:
        result = await act(
            storage,
            journal,
            settings.retention,
            settings.run.output_dir,
            settings.checkpoints.pattern,
        )
    finally:
        await storage.aclose()
        journal.close()
    verb = "would delete" if args.dry_run else "deleted"
    for where, verdicts in (("store", result.remote), ("local", result.local)):
        for v in sorted(verdicts, key=lambda v: v.step):
            print(f"{where:5}  {v.tag:24} {'keep' if v.keep else verb:13} {v.reason}")
    if not result.remote and not result.local:
        print(f"nothing to prune: no checkpoints in {storage.describe} or in "
              f"{settings.run.output_dir}")
    return 0


_HANDLERS: dict[str, Handler] = {
    "run": _run,
    "check-config": _check_config,
    "list": _list,
    "pull": _pull,
    "verify": _verify,
    "push": _push,
    "prune": _prune,
    "status": _status,
    "launch": _launch,
}

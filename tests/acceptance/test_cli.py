"""The ``traind`` command line as an operator uses it: help, check-config, push, list, pull,
prune."""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.daemon import DaemonProcess, write_config
from tests.support.net import free_port
from tests.support.requires import need_module

from traind.util.nodes import RANK_VARIABLES

COMMANDS = ["run", "check-config", "list", "pull", "verify", "push", "prune"]


def traind(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traind", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return write_config(
        tmp_path / "traind.toml",
        run="exp",
        output_dir=out,
        state_dir=tmp_path / "state",
        storage=f'type = "local"\npath = "{tmp_path / "store"}"',
    )


def make_ckpt(parent: Path, step: int) -> Path:
    d = parent / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(200_000))
    (d / "sub/extra.pt").write_bytes(b"z" * 10)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


@pytest.mark.parametrize("command", COMMANDS)
def test_help_explains_with_an_example(command: str) -> None:
    """Every subcommand's --help describes it and shows an example."""
    result = traind(command, "--help")
    assert result.returncode == 0
    assert "--config" in result.stdout
    assert "example" in result.stdout
    assert f"traind {command}" in result.stdout


def test_check_config_reports_every_problem(tmp_path: Path) -> None:
    """A bad file: every problem printed, exit code non-zero."""
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[run]\nname = "a b"\noutput_dir = "/x"\n[storage]\ntype = "local"\n'
        "[retention]\nkeep_lats = 3\n"
    )
    result = traind("check-config", "-c", str(bad))
    assert result.returncode == 2
    assert "run.name = 'a b'" in result.stderr
    assert "storage.path: required key is missing" in result.stderr
    assert "retention.keep_lats: unknown key" in result.stderr


def test_check_config_uses_traind_config_env(cfg: Path) -> None:
    """$TRAIND_CONFIG is used when -c is not given, and the store is probed."""
    result = traind("check-config", env={"TRAIND_CONFIG": str(cfg)})
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout
    assert "reachable and writable" in result.stdout


def test_push_list_pull_round_trip(cfg: Path, tmp_path: Path) -> None:
    """push commits a directory; list shows it; pull restores identical bytes."""
    src = make_ckpt(tmp_path / "elsewhere", 7)
    assert traind("push", "-c", str(cfg), str(src)).returncode == 0
    listing = traind("list", "-c", str(cfg), "--json")
    rows = json.loads(listing.stdout)
    assert [(r["tag"], r["step"], r["files"], r["global_step"]) for r in rows] == [
        ("checkpoint-7", 7, 3, 7)
    ]
    table = traind("list", "-c", str(cfg)).stdout
    assert "checkpoint-7" in table
    assert "TAG" in table
    pulled = traind("pull", "-c", str(cfg), "latest", str(tmp_path / "back"))
    assert pulled.returncode == 0, pulled.stderr
    dest = tmp_path / "back/checkpoint-7"
    assert pulled.stdout.strip() == str(dest)
    for f in src.rglob("*"):
        if f.is_file():
            assert (dest / f.relative_to(src)).read_bytes() == f.read_bytes()
    again = traind("pull", "-c", str(cfg), "latest", str(tmp_path / "back"))
    assert again.returncode == 1
    assert "already exists" in again.stderr


def test_pull_unknown_tag_and_push_bad_dir(cfg: Path, tmp_path: Path) -> None:
    """Clear errors for a missing tag and for pushing something that is not a checkpoint."""
    result = traind("pull", "-c", str(cfg), "checkpoint-3", str(tmp_path / "x"))
    assert result.returncode == 1
    assert "no committed checkpoint 'checkpoint-3'" in result.stderr
    result = traind("push", "-c", str(cfg), str(tmp_path / "missing"))
    assert result.returncode == 1
    assert "not a directory" in result.stderr
    odd = tmp_path / "weights"
    odd.mkdir()
    result = traind("push", "-c", str(cfg), str(odd))
    assert result.returncode == 1
    assert "--tag checkpoint-N" in result.stderr


def test_prune_dry_run_then_prune(cfg: Path, tmp_path: Path) -> None:
    """--dry-run says what would go and why, deleting nothing; prune then deletes it."""
    cfg.write_text(cfg.read_text().replace("keep_last = 100", "keep_last = 2"))
    empty = traind("prune", "-c", str(cfg), "--dry-run")
    assert empty.returncode == 0
    assert "nothing to prune: no checkpoints in " in empty.stdout
    for step in (1, 2, 3):
        assert (
            traind("push", "-c", str(cfg), str(make_ckpt(tmp_path / "src", step))).returncode == 0
        )
    dry = traind("prune", "-c", str(cfg), "--dry-run")
    assert dry.returncode == 0
    assert "checkpoint-1" in dry.stdout
    assert "would delete" in dry.stdout
    assert "newest" in dry.stdout
    assert len(json.loads(traind("list", "-c", str(cfg), "--json").stdout)) == 3
    assert traind("prune", "-c", str(cfg)).returncode == 0
    tags = [r["tag"] for r in json.loads(traind("list", "-c", str(cfg), "--json").stdout)]
    assert tags == ["checkpoint-2", "checkpoint-3"]


def test_push_never_replaces_a_committed_checkpoint(cfg: Path, tmp_path: Path) -> None:
    """A second push under a committed tag is refused; the committed bytes stay intact."""
    first = make_ckpt(tmp_path / "one", 5)
    assert traind("push", "-c", str(cfg), str(first)).returncode == 0
    again = traind("push", "-c", str(cfg), str(make_ckpt(tmp_path / "two", 5)))
    assert again.returncode == 1
    assert "checkpoint-5 is already committed" in again.stderr
    assert "--tag" in again.stderr
    pulled = traind("pull", "-c", str(cfg), "checkpoint-5", str(tmp_path / "back"))
    assert pulled.returncode == 0, pulled.stderr
    restored = tmp_path / "back/checkpoint-5/model.safetensors"
    assert restored.read_bytes() == (first / "model.safetensors").read_bytes()
    second = tmp_path / "two/checkpoint-5"
    other = traind("push", "-c", str(cfg), "--tag", "checkpoint-6", str(second))
    assert other.returncode == 0, other.stderr


def test_config_problems_outside_the_keys_exit_2(cfg: Path, tmp_path: Path) -> None:
    """A file that is not UTF-8 and a list override that is not JSON are config problems
    (exit 2, one line each), not tracebacks."""
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(cfg.read_bytes() + b"# caf\xe9\n")
    result = traind("check-config", "--offline", "-c", str(latin1))
    assert result.returncode == 2
    assert f"in {latin1}:\n  - not UTF-8 text" in result.stderr
    result = traind(
        "check-config", "--offline", "-c", str(cfg),
        env={"TRAIND_TRAINER__COMMAND": "python train.py"},
    )
    assert result.returncode == 2
    assert "$TRAIND_TRAINER__COMMAND = 'python train.py': not JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_config_path_is_refused(cfg: Path) -> None:
    """`-c ""` is an error, not a quiet fall-back to $TRAIND_CONFIG or /etc/traind."""
    result = traind("check-config", "--offline", "-c", "", env={"TRAIND_CONFIG": str(cfg)})
    assert result.returncode == 2
    assert "argument -c/--config: empty path" in result.stderr


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_status_watch_needs_a_positive_interval(cfg: Path, seconds: str) -> None:
    """`status --watch` refuses an interval that would flood the terminal."""
    result = traind("status", "-c", str(cfg), "--watch", seconds)
    assert result.returncode == 2
    assert f"argument --watch: '{seconds}': must be a number of seconds above 0" in result.stderr


def test_os_errors_are_one_line(cfg: Path, tmp_path: Path) -> None:
    """A file where a directory should be, or a journal that is not a database: one line
    naming what failed and where, exit 1, no traceback."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    assert traind("push", "-c", str(cfg), str(make_ckpt(tmp_path / "src", 1))).returncode == 0
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "journal.sqlite3").write_text("not a database")
    for args, env, named in [
        (("pull", "latest", str(afile)), {}, str(afile)),
        (("prune",), {"TRAIND_RUN__STATE_DIR": str(afile)}, str(afile)),
        (("prune",), {"TRAIND_RUN__STATE_DIR": str(corrupt)}, "journal"),
    ]:
        result = traind(*args, "-c", str(cfg), env=env)
        assert result.returncode == 1, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith("traind: ")
        assert named in line


def test_run_with_status_port_in_use(tmp_path: Path) -> None:
    """`traind run` whose status port is taken says so in one line and exits 1."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = write_config(
            tmp_path / "traind.toml",
            run="exp",
            output_dir=tmp_path / "out",
            state_dir=tmp_path / "state",
            storage=f'type = "local"\npath = "{tmp_path / "store"}"',
            status_port=port,
        )
        result = traind("run", "-c", str(cfg))
    assert result.returncode == 1
    assert result.stderr == (
        f"traind: status.listen 127.0.0.1:{port} is already in use (another traind?)\n"
    )


def test_check_config_gives_up_on_a_store_that_never_answers(tmp_path: Path) -> None:
    """An S3 endpoint that accepts connections and says nothing fails within --timeout (with
    the default read_timeout and retries it took ~9 minutes), in one line naming it."""
    need_module("aiobotocore")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        cfg = write_config(
            tmp_path / "traind.toml", run="r", output_dir=tmp_path / "out",
            state_dir=tmp_path / "state",
            storage=f'type = "s3"\nbucket = "b"\nendpoint_url = "{endpoint}"\n'
                    'access_key_id = "k"\nsecret_access_key = "s"\nregion = "us-east-1"',
        )
        started = time.monotonic()
        result = traind("check-config", "-c", str(cfg), "--timeout", "2")
        took = time.monotonic() - started
    assert result.returncode == 1
    assert "no complete answer within 2 s" in result.stderr
    assert endpoint in result.stderr
    assert "Traceback" not in result.stderr
    assert took < 20


def test_version_and_options_before_the_command(cfg: Path, tmp_path: Path) -> None:
    """`traind --version` names the version; -c and the log options work before COMMAND as
    after it (`traind -c x.toml list` was `invalid choice`)."""
    version = traind("--version")
    assert version.returncode == 0
    assert re.fullmatch(r"traind \d+\.\d+\.\d+\S*\n", version.stdout)
    before = traind("-c", str(cfg), "list")
    assert before.returncode == 0, before.stderr
    assert "no committed checkpoints" in before.stdout
    src = make_ckpt(tmp_path / "src", 3)
    loud = traind("-v", "--log-format", "console", "-c", str(cfg), "push", str(src))
    assert loud.returncode == 0, loud.stderr
    assert "checkpoint_committed" in loud.stderr
    assert not loud.stderr.lstrip().startswith("{")  # console, not JSON
    quiet = traind("-c", str(cfg), "-q", "pull", "latest", str(tmp_path / "back"))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""  # info events (checkpoint_restored) are not shown
    leveled = traind("verify", "-c", str(cfg), "--log-level", "WARNING")
    assert leveled.returncode == 0, leveled.stderr
    assert "checkpoint-3: OK" in leveled.stdout


def test_results_on_stdout_logs_on_stderr(cfg: Path, tmp_path: Path) -> None:
    """Piped, push, pull, check-config, verify and prune print results only on stdout
    (no JSON log line in it, sizes human) and their log events as JSON lines on stderr."""
    src = make_ckpt(tmp_path / "src", 4)
    runs = {
        "push": traind("push", "-c", str(cfg), str(src)),
        "pull": traind("pull", "-c", str(cfg), "latest", str(tmp_path / "back")),
        "check-config": traind("check-config", "-c", str(cfg)),
        "verify": traind("verify", "-c", str(cfg)),
        "prune": traind("prune", "-c", str(cfg)),
    }
    for name, result in runs.items():
        assert result.returncode == 0, (name, result.stderr)
        assert result.stdout.strip(), name
        for line in result.stdout.splitlines():
            assert not line.lstrip().startswith("{"), (name, line)
        for line in result.stderr.splitlines():
            assert isinstance(json.loads(line), dict), (name, line)
    assert runs["push"].stdout == "checkpoint-4: committed (3 files, 195.3 KiB)\n"
    events = [json.loads(line)["event"] for line in runs["push"].stderr.splitlines()]
    assert "checkpoint_committed" in events
    assert "checkpoint_restored" in runs["pull"].stderr


def screen_lines(raw: str) -> list[str]:
    """What a terminal shows for ``raw``: carriage returns and erase-line (ESC [K) applied,
    colours dropped, one string per line."""
    shown = []
    for row in re.sub(r"\x1b\[[0-9;]*m", "", raw).replace("\r\n", "\n").split("\n"):
        line: list[str] = []
        col = 0
        for part in re.split(r"(\r|\x1b\[K)", row):
            if part == "\r":
                col = 0
            elif part == "\x1b[K":
                del line[col:]
            else:
                line[col:col + len(part)] = list(part)
                col += len(part)
        shown.append("".join(line))
    return shown


def on_a_terminal(*args: str, timeout: float = 120) -> tuple[int, str]:
    """Run traind with stdout and stderr on a pty; its exit status and all it wrote."""
    controller, terminal = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "traind", *args], stdin=subprocess.DEVNULL,
                                stdout=terminal, stderr=terminal, start_new_session=True)
        os.close(terminal)
        terminal = -1
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the process closed its end
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
        return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)


def test_progress_bar_and_log_lines_never_share_a_line(cfg: Path, tmp_path: Path) -> None:
    """On a TTY, push draws a progress bar and logs for people; no log line is shown on
    the bar's line (was `... ETA 0s2026-12-01T08:22:57Z [info] checkpoint_committed`)."""
    src = make_ckpt(tmp_path / "src", 9)
    (src / "shards").mkdir()
    for i in range(2000):  # one fsync each: the bar is drawn before checkpoint_committed
        (src / "shards" / f"{i:04}.bin").write_bytes(os.urandom(1024))
    code, raw = on_a_terminal("push", "-c", str(cfg), str(src))
    assert code == 0, raw
    assert "ETA" in raw.split("checkpoint_committed")[0], "no bar drawn mid-push: " + raw
    lines = screen_lines(raw)
    assert any("checkpoint_committed" in line for line in lines), raw
    for line in lines:
        assert not ("ETA" in line and "[info" in line), line
    assert "checkpoint-9: committed (2003 files, 2.1 MiB)" in lines


def test_push_and_pull_dry_run_touch_nothing(cfg: Path, tmp_path: Path) -> None:
    """push --dry-run lists what would be sent with sizes and stores nothing (no state_dir
    either); pull --dry-run names what would be fetched and downloads nothing."""
    src = make_ckpt(tmp_path / "src", 5)
    dry = traind("push", "-c", str(cfg), "--dry-run", str(src))
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0].startswith(f"would push {src} as checkpoint-5 to ")
    assert "3 files, 195.3 KiB" in dry.stdout
    assert "195.3 KiB  model.safetensors" in dry.stdout
    assert "10 B  sub/extra.pt" in dry.stdout
    assert json.loads(traind("list", "-c", str(cfg), "--json").stdout) == []
    assert not (tmp_path / "state").exists()
    assert traind("push", "-c", str(cfg), str(src)).returncode == 0
    again = traind("push", "-c", str(cfg), "--dry-run", str(src))
    assert again.returncode == 1
    assert "checkpoint-5 is already committed" in again.stderr
    back = tmp_path / "back"
    pulled = traind("pull", "-c", str(cfg), "--dry-run", "latest", str(back))
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.splitlines()[0].startswith(
        f"would fetch checkpoint-5 from local:{tmp_path / 'store'}"
    )
    assert f"into {back / 'checkpoint-5'}: 3 files, 195.3 KiB" in pulled.stdout
    assert "195.3 KiB  model.safetensors" in pulled.stdout
    assert not back.exists()
    (back / "checkpoint-5").mkdir(parents=True)
    refused = traind("pull", "-c", str(cfg), "--dry-run", "checkpoint-5", str(back))
    assert refused.returncode == 1
    assert "already exists" in refused.stderr


@pytest.mark.parametrize("how", ["--no-restore", "run.restore = false"])
def test_run_without_restore_leaves_output_dir_empty(cfg: Path, tmp_path: Path, how: str) -> None:
    """`traind run --no-restore`, or run.restore = false, starts on an empty output_dir
    without restoring the store's newest checkpoint into it."""
    assert traind("push", "-c", str(cfg), str(make_ckpt(tmp_path / "src", 2))).returncode == 0
    args: tuple[str, ...] = ()
    if how == "--no-restore":
        args = (how,)
    else:
        cfg.write_text(cfg.read_text().replace('stop_timeout = "10s"',
                                               'stop_timeout = "10s"\nrestore = false'))
    daemon = DaemonProcess(cfg, args=args)
    try:
        skipped = daemon.wait_for("restore_disabled", timeout=60)
        assert skipped["output_dir"] == str(tmp_path / "out")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert list((tmp_path / "out").iterdir()) == []
    assert not daemon.named("checkpoint_restored")


@pytest.mark.parametrize("bad_edit", ["key", "syntax"])
def test_status_finds_the_daemon_when_the_config_is_broken(
    cfg: Path, tmp_path: Path, bad_edit: str
) -> None:
    """After a bad edit of the config file, `traind status` still shows the running daemon
    (at the address it published in state_dir); --url reaches it without the file; once it
    stopped, status says where it looked, exit 3."""
    port = int(re.findall(r"127\.0\.0\.1:(\d+)", cfg.read_text())[0])
    published = tmp_path / "state/status.address"
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("status_server_started", timeout=60)
        deadline = time.monotonic() + 30  # written right after the server listens
        while not published.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert published.read_text() == f"127.0.0.1:{port}\n"
        good = cfg.read_text()
        broken = good.replace("keep_last = 100", "keep_lats = 100") if bad_edit == "key" \
            else good.replace("[retention]", "[retention")
        # a different port in the file: only the published address finds the daemon
        cfg.write_text(broken.replace(f"127.0.0.1:{port}", "127.0.0.1:1"))
        shown = traind("status", "-c", str(cfg))
        assert shown.returncode == 0, shown.stderr
        assert "exp" in shown.stdout
        assert f"{cfg} is not a valid config" in shown.stderr
        assert f"asking 127.0.0.1:{port}, published in {published}" in shown.stderr
        direct = traind("status", "--url", f"http://127.0.0.1:{port}", "--json",
                        env={"TRAIND_CONFIG": str(tmp_path / "missing.toml")})
        assert direct.returncode == 0, direct.stderr
        assert isinstance(json.loads(direct.stdout), dict)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert not published.exists()
    gone = traind("status", "-c", str(cfg))
    assert gone.returncode == 3
    assert "no traind answering at 127.0.0.1:1" in gone.stderr
    assert f"status.listen in {cfg}" in gone.stderr


def test_status_url_and_socket_say_what_they_could_not_reach(tmp_path: Path) -> None:
    """--socket and --url need no config file; nothing there: one line naming it, exit 3;
    a --url that is not http://HOST:PORT is a usage error."""
    sock = tmp_path / "status.sock"
    nothing = {"TRAIND_CONFIG": str(tmp_path / "missing.toml")}
    result = traind("status", "--socket", str(sock), env=nothing)
    assert result.returncode == 3
    assert f"no traind answering at unix:{sock}" in result.stderr
    port = free_port()
    result = traind("status", "--url", f"127.0.0.1:{port}", env=nothing)
    assert result.returncode == 3
    assert f"no traind answering at 127.0.0.1:{port}" in result.stderr
    result = traind("status", "--url", "https://example.com/x", env=nothing)
    assert result.returncode == 2
    assert "write http://HOST:PORT" in result.stderr


HEAVY = ("asyncio", "aiohttp", "aiobotocore", "asyncssh", "pydantic", "pydantic_settings",
         "structlog", "traind.config", "traind.launch")
"""What a command that needs none of it must not import: each costs tens of milliseconds of
start-up, and `traind --version` and `traind status` are typed often."""


def imported(*args: str) -> set[str]:
    """The packages and modules `traind ARGS` imports, as `python -X importtime` reports
    them; the command must succeed."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "traind", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    names = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:") and "[us]" not in line}
    return names | {n.split(".")[0] for n in names}


def test_version_and_status_import_only_what_they_need(cfg: Path) -> None:
    """`traind --version`, and `traind status` finding the daemon where the file says, import
    no event loop, HTTP client library, pydantic, structlog or store library; `traind list`
    of a local store imports no other store's library and not the launch package."""
    assert imported("--version") & set(HEAVY) == set()
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_for("status_server_started", timeout=60)
        assert imported("status", "-c", str(cfg)) & set(HEAVY) == set()
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    listed = imported("list", "-c", str(cfg))
    assert listed & {"aiobotocore", "asyncssh", "aiohttp", "traind.launch"} == set()


def test_run_names_the_node_rank_and_its_source(cfg: Path) -> None:
    """`traind run` with run.nodes = 2 says at start-up which rank it is and which scheduler
    variable gave it; with a [trainer] it then waits for node 0 (never started here) to
    decide the resume point, starts no trainer, and stops cleanly on SIGTERM."""
    env = {"TRAIND_RUN__NODES": "2", "SKYPILOT_NODE_RANK": "1", "NODE_RANK": "0",
           "TRAIND_TRAINER__COMMAND": '["true"]'}
    daemon = DaemonProcess(cfg, env=env)
    try:
        started = daemon.wait_for("daemon_starting", timeout=60)
        waiting = daemon.wait_for("waiting_for_resume_point", timeout=60)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert (started["nodes"], started["node_rank"]) == (2, 1)
    assert started["node_rank_from"] == "$SKYPILOT_NODE_RANK"
    assert (waiting["node_rank"], waiting["missing"]) == (1, None)
    assert not daemon.named("child_started")


def test_run_without_a_node_rank_is_refused(cfg: Path) -> None:
    """`traind run` with run.nodes = 2 and no rank in the config or the environment exits 2
    before starting anything, naming the keys and variables that give one."""
    env = {name: "" for name in RANK_VARIABLES}
    result = traind("run", "-c", str(cfg), env={**env, "TRAIND_RUN__NODES": "2"})
    assert result.returncode == 2
    assert "run.nodes = 2 but no node rank: set run.node_rank" in result.stderr
    assert "SKYPILOT_NODE_RANK" in result.stderr

"""Configuration loading: defaults, environment overrides, and one clear error per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.requires import need_module

from traind import config
from traind.config import LocalStorage
from traind.errors import ConfigError
from traind.launch import config as launch_config
from traind.util.nodes import RANK_VARIABLES, NodeRank

MINIMAL = """
[run]
name = "exp1"
output_dir = "/data/out"

[storage]
type = "local"
path = "/mnt/ckpt"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "traind.toml"
    path.write_text(text)
    return path


def test_minimal_file_gets_defaults(tmp_path: Path) -> None:
    """A file with only run and storage loads with documented defaults."""
    s = config.load(write(tmp_path, MINIMAL))
    assert isinstance(s.storage, LocalStorage)
    assert s.storage.path == Path("/mnt/ckpt")
    assert s.checkpoints.settle == 5.0
    assert s.checkpoints.markers == ("trainer_state.json", ".metadata")
    assert s.retention.keep_last == 5
    assert s.run.state_dir == Path("/var/lib/traind")
    assert s.trainer is None
    assert s.vllm is None
    assert s.services == ()


def test_example_configs_are_valid() -> None:
    """Every example in config/ loads (each key documented there is real)."""
    examples = sorted(
        p
        for p in Path(__file__).parents[2].joinpath("config").glob("*.toml")
        if p.name != "launch.toml"  # traind launch's own file; checked in test_launch_vast.py
    )
    assert examples
    for path in examples:
        config.load(path)


def test_grpo_example_runs_vllm_as_trl_documents_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """config/grpo.toml's [vllm] is the `vllm serve` command the installed TRL's
    `trl vllm-serve` execs for vLLM 0.30+ (with VLLM_SERVER_DEV_MODE=1), polled on /health;
    defaults restart vLLM's own server after a trainer death and watch for stalls."""
    need_module("trl")
    from trl.scripts import vllm_serve
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    monkeypatch.setattr(vllm_serve, "is_vllm_available", lambda **kw: True)  # vLLM 0.31

    vllm = config.load(Path(__file__).parents[2] / "config" / "grpo.toml").vllm
    assert vllm is not None
    model, host, port = vllm.command[2], vllm.command[4], int(vllm.command[6])
    trl = build_command(ScriptArguments(model=model, host=host, port=port))
    assert list(vllm.command) == ["vllm", *trl[trl.index("serve"):]]
    assert vllm.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert vllm.health.url == f"http://{host}:{port}/health"
    defaults = config.VLLMConfig.model_validate(
        {"command": ["vllm", "serve", "m"], "health": {"url": "http://h:1/health"}})
    assert (defaults.on_trainer_restart, defaults.health.stall_timeout) == ("auto", 300.0)


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRAIND_<SECTION>__<KEY> overrides the file and keeps the other keys."""
    monkeypatch.setenv("TRAIND_RETENTION__KEEP_LAST", "9")
    monkeypatch.setenv("TRAIND_STORAGE__PATH", "/elsewhere")
    s = config.load(write(tmp_path, MINIMAL))
    assert s.retention.keep_last == 9
    assert s.storage.type == "local"
    assert s.storage.path == Path("/elsewhere")


def test_settings_are_frozen(tmp_path: Path) -> None:
    """Config is data: nothing can be written back onto it."""
    s = config.load(write(tmp_path, MINIMAL))
    with pytest.raises(ValueError, match="frozen"):
        s.retention.keep_last = 1  # type: ignore[misc]


def test_every_problem_is_reported_with_key_and_value(tmp_path: Path) -> None:
    """A bad file lists each problem, naming the key, the value and what is allowed."""
    text = MINIMAL.replace('name = "exp1"', 'name = "my run"') + (
        '\n[checkpoints]\nsettle = "5 parsecs"\nsetle = "1s"\n\n[retention]\nkeep_last = 0\n'
    )
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    problems = info.value.problems
    assert len(problems) == 4, problems
    joined = "\n".join(problems)
    assert "run.name = 'my run'" in joined
    assert "checkpoints.settle = '5 parsecs'" in joined
    assert "'30s'" in joined
    assert "checkpoints.setle: unknown key" in joined
    assert "retention.keep_last = 0" in joined


def test_unknown_sections_are_named(tmp_path: Path) -> None:
    """An unknown top-level section is named even when it shares a storage type's name."""
    text = MINIMAL + '\n[ssh]\nhost = "gpu-1"\n\n[s3]\nbucket = "b"\n'
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    assert sorted(info.value.problems) == [
        "s3: unknown key (check the spelling; see config/ for every key)",
        "ssh: unknown key (check the spelling; see config/ for every key)",
    ]


def test_a_launch_file_is_recognised(tmp_path: Path) -> None:
    """Given a ``traind launch`` file, check-config says what it is (not 17 key errors)."""
    text = (Path(__file__).parents[2] / "config" / "launch.toml").read_text()
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("this is a `traind launch` file")


def test_unknown_storage_type(tmp_path: Path) -> None:
    """An unknown backend names the allowed ones."""
    with pytest.raises(ConfigError, match=r"storage.type = 'ftp'.*local, s3, ssh"):
        config.load(write(tmp_path, MINIMAL.replace('"local"', '"ftp"')))


def test_missing_required_keys(tmp_path: Path) -> None:
    """Missing required keys are named one by one."""
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, '[storage]\ntype = "s3"\n'))
    assert "run: required key is missing" in info.value.problems
    assert "storage.bucket: required key is missing" in info.value.problems


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    """Broken TOML and a missing file are config errors that say so."""
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(write(tmp_path, "[run\nname="))
    with pytest.raises(ConfigError, match="not found"):
        config.load(tmp_path / "nope.toml")


def test_config_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    """--config beats $TRAIND_CONFIG, which beats the default path."""
    monkeypatch.delenv("TRAIND_CONFIG", raising=False)
    assert config.config_path(None) == config.DEFAULT_CONFIG
    monkeypatch.setenv("TRAIND_CONFIG", "/x.toml")
    assert config.config_path(None) == Path("/x.toml")
    assert config.config_path("/y.toml") == Path("/y.toml")


def test_non_utf8_file_names_the_file_and_offset(tmp_path: Path) -> None:
    """A file with bytes that are not UTF-8 is a config error with the byte's offset."""
    path = tmp_path / "traind.toml"
    path.write_bytes(MINIMAL.encode() + b"\n# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert info.value.source == str(path)
    offset, line = len(MINIMAL.encode() + b"\n# caf"), MINIMAL.count("\n") + 2
    assert info.value.problems == [
        f"not UTF-8 text, as TOML must be: byte 0xe9 at offset {offset} (line {line})"
    ]
    launch = tmp_path / "launch.toml"
    launch.write_bytes(b'backend = "local"\n# \xff\n')
    with pytest.raises(ConfigError, match=r"byte 0xff at offset 20 \(line 2\)"):
        launch_config.load(launch)  # traind launch reads its file the same way


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("checkpoints", "poll_interval"),
        ("retention", "interval"),
        ("trainer", "progress_timeout"),
        ("trainer", "first_progress_timeout"),
        ("trainer.restart", "window"),
        ("trainer.restart", "stable_after"),
    ],
)
def test_intervals_and_timeouts_must_be_positive(section: str, key: str) -> None:
    """An interval or timeout of 0 (a busy loop, or an instant failure) is refused by name."""
    data: dict[str, Any] = {
        "run": {"name": "r", "output_dir": "/o"},
        "storage": {"type": "local", "path": "/a"},
        "trainer": {"command": ["true"], "restart": {}},
    }
    target = data
    for part in section.split("."):
        target = target.setdefault(part, {})
    target[key] = "0s"
    with pytest.raises(ConfigError) as info:
        config.validate(data)
    assert info.value.problems == [f"{section}.{key} = '0s': must be longer than 0 (e.g. '1s')"]


@pytest.mark.parametrize(
    "storage",
    [
        'type = "s3"\nbucket = "b"\nconnect_timeout = 0\nread_timeout = 0',
        'type = "ssh"\nhost = "h"\nremote_path = "/r"\nconnect_timeout = 0\nkeepalive = 0',
    ],
)
def test_storage_timeouts_must_be_positive(tmp_path: Path, storage: str) -> None:
    """The store's timeouts and keepalive are refused at 0."""
    text = MINIMAL.replace('type = "local"\npath = "/mnt/ckpt"', storage)
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    assert len(info.value.problems) == 2
    assert all(p.endswith("= 0: must be longer than 0 (e.g. '1s')") for p in info.value.problems)


def test_health_durations_must_be_positive() -> None:
    """A health check's interval, timeout and ready_timeout are refused at 0."""
    with pytest.raises(ConfigError) as info:
        config.validate({
            "run": {"name": "r", "output_dir": "/o"},
            "storage": {"type": "local", "path": "/a"},
            "vllm": {"command": ["vllm"], "health": {
                "url": "http://127.0.0.1:8000/health", "interval": 0, "timeout": 0,
                "ready_timeout": 0,
            }},
        })
    assert sorted(p.split(" =")[0] for p in info.value.problems) == [
        "vllm.health.interval", "vllm.health.ready_timeout", "vllm.health.timeout",
    ]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_durations_must_be_finite(tmp_path: Path, bad: str) -> None:
    """nan and infinity (TOML floats) are refused even where 0 is allowed."""
    text = MINIMAL + f"\n[checkpoints]\nsettle = {bad}\n"
    with pytest.raises(ConfigError, match=r"checkpoints\.settle = .*finite"):
        config.load(write(tmp_path, text))


def test_zero_is_allowed_where_it_means_something(tmp_path: Path) -> None:
    """settle, stop_timeout and stop_grace of 0 (commit at once, stop at once) are allowed."""
    text = MINIMAL.replace('output_dir = "/data/out"', 'output_dir = "/data/out"\nstop_timeout = 0')
    text += '\n[checkpoints]\nsettle = "0s"\n\n[trainer]\ncommand = ["true"]\nstop_grace = 0\n'
    s = config.load(write(tmp_path, text))
    assert (s.checkpoints.settle, s.run.stop_timeout) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        ("TRAIND_CHECKPOINTS__MARKERS", "foo", "'foo'"),
        ("TRAIND_CHECKPOINTS__MARKERS", '["a",', """'["a",'"""),
        ("TRAIND_TRAINER__COMMAND", "python train.py", "'python train.py'"),
        ("TRAIND_TRAINER__COMMAND", "python train.py --endpoint http://u:pw@h",
         "'python train.py --endpoint http://u:***@h'"),
        ("TRAIND_RUN", "xyz", "(a table: its value is not shown)"),
        ("TRAIND_TRAINER__ENV", '{"HF_TOKEN": "hf_secret"', "(a table: its value is not shown)"),
    ],
)
def test_environment_list_that_is_not_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, shown: str
) -> None:
    """A list or table override that is not JSON names the variable and says to write JSON;
    a list's value is shown (a URL's password masked), a table's, which may hold secrets
    (a child's env, [storage]), is not."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL))
    [problem] = info.value.problems
    assert problem.startswith(f"${variable} = {shown}: not JSON")
    assert '["python", "train.py"]' in problem


def test_environment_list_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A list override written as JSON is used."""
    monkeypatch.setenv("TRAIND_TRAINER__COMMAND", '["python", "train.py"]')
    s = config.load(write(tmp_path, MINIMAL))
    assert s.trainer is not None
    assert s.trainer.command == ("python", "train.py")


def test_bad_environment_value_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad value from the environment is blamed on its variable, not on the file."""
    monkeypatch.setenv("traind_retention__keep_last", "abc")
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL + "\n[checkpoints]\nsettle = -1\n"))
    assert sorted(info.value.problems) == [
        "checkpoints.settle = -1: a duration cannot be negative",
        "retention.keep_last (from $traind_retention__keep_last) = 'abc': "
        "Input should be a valid integer, unable to parse string as an integer",
    ]


@pytest.mark.parametrize("key", ["output_dir", "state_dir", "path"])
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "must not be empty"),
        ("out", "must be an absolute path"),
        ("/o\0x", "must not contain a NUL character"),
    ],
)
def test_empty_and_relative_directories_are_refused(
    tmp_path: Path, key: str, value: str, problem: str
) -> None:
    """output_dir, state_dir and a local store's path must be absolute paths: "" would be the
    working directory."""
    section = "storage" if key == "path" else "run"
    data = {"run": {"name": "r", "output_dir": "/o"}, "storage": {"type": "local", "path": "/a"}}
    data[section][key] = value
    with pytest.raises(ConfigError) as info:
        config.validate(data)
    [found] = info.value.problems
    assert found.startswith(f"{section}.{key} = {value!r}: {problem}")


SAME = "is the same directory as"


@pytest.mark.parametrize(
    ("output_dir", "state_dir", "store", "expected"),
    [
        ("/x", "/s", "/x", f"run.output_dir = '/x' {SAME} storage.path = '/x'"),
        ("/x/run", "/s", "/x", "run.output_dir = '/x/run' is inside storage.path = '/x'"),
        ("/x", "/s", "/x/store", "run.output_dir = '/x' contains storage.path = '/x/store'"),
        ("/x", "/x/state", "/st", "run.output_dir = '/x' contains run.state_dir = '/x/state'"),
        ("/x", "/x", "/st", f"run.output_dir = '/x' {SAME} run.state_dir = '/x'"),
        ("/x", "/st/state", "/st", "run.state_dir = '/st/state' is inside storage.path = '/st'"),
        ("/x", "/st", "/st", f"run.state_dir = '/st' {SAME} storage.path = '/st'"),
    ],
)
def test_overlapping_directories_are_refused(
    output_dir: str, state_dir: str, store: str, expected: str
) -> None:
    """output_dir, state_dir and a local store may not be one inside another (retention
    would delete store copies); each overlap names both keys and paths."""
    with pytest.raises(ConfigError) as info:
        config.validate({
            "run": {"name": "r", "output_dir": output_dir, "state_dir": state_dir},
            "storage": {"type": "local", "path": store},
        })
    assert [p.split(": they")[0] for p in info.value.problems] == [expected]


def test_overlap_is_found_through_a_symlink(tmp_path: Path) -> None:
    """Directories are compared resolved: a symlink to the store is the store."""
    (tmp_path / "store").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "store")
    with pytest.raises(ConfigError, match=r"\(resolved: .*store\) is the same directory as"):
        config.validate({
            "run": {"name": "r", "output_dir": str(tmp_path / "link"),
                    "state_dir": str(tmp_path / "state")},
            "storage": {"type": "local", "path": str(tmp_path / "store")},
        })


def test_missing_storage_type_lists_the_types(tmp_path: Path) -> None:
    """A [storage] without type says the key is missing and which types there are."""
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL.replace('type = "local"\n', "")))
    assert info.value.problems == [
        "storage.type: required key is missing; one of local, s3, ssh, hf"]


def test_hf_storage_keeps_its_token_secret(tmp_path: Path) -> None:
    """A [storage] type = "hf" loads with its defaults; its token never shows in the
    config's repr, and HF_TOKEN is not passed to a child."""
    from traind.config import HFStorage, TrainerConfig
    from traind.supervisor.env import Role, child_env

    settings = config.validate({
        "run": {"name": "r", "output_dir": str(tmp_path / "out"),
                "state_dir": str(tmp_path / "state")},
        "storage": {"type": "hf", "repo_id": "org/ckpts", "token": "hf_secretvalue"}})
    storage = settings.storage
    assert isinstance(storage, HFStorage)
    assert (storage.repo_type, storage.revision, storage.path_in_repo) == ("model", "main", "")
    assert "hf_secretvalue" not in repr(settings)
    env = child_env({"HF_TOKEN": "hf_x", "PATH": "/bin"}, TrainerConfig(command=["true"]),
                    Role.TRAINER)
    assert "HF_TOKEN" not in env
    with pytest.raises(ConfigError, match="repo_id"):
        config.validate({"run": {"name": "r", "output_dir": str(tmp_path / "out")},
                         "storage": {"type": "hf", "repo_id": "no-namespace"}})


S3_SECRETS = """
[storage]
type = "s3"
bucket = "ckpts"
endpoint_url = "http://admin:pa55-in-url@127.0.0.1:8333"
access_key_id = 12345678
secret_access_key = ["wJalrXUtnFEMI-secret"]
session_token = { value = "FwoGZXIvYXdz-token" }
region = 5
"""


def test_a_secret_of_the_wrong_type_is_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage key or token of the wrong type is reported by key, its value masked
    whatever its type; a password inside a URL is masked in every problem showing it; nor
    is a table of secrets given as one value shown."""
    text = MINIMAL.split("[storage]")[0] + S3_SECRETS + (
        '\n[trainer]\ncommand = ["t"]\nenv = { HF_TOKEN = 123, WANDB_API_KEY = ["k-secret"], '
        'PLAIN = 7 }\n\n[vllm]\ncommand = ["v"]\n'
        'health = { url = ["http://u:pa55-in-health@127.0.0.1:8001/health"] }\n')
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    shown = str(info.value)
    for secret in ("12345678", "wJalrXUtnFEMI", "FwoGZXIvYXdz", "123", "k-secret", "pa55"):
        assert secret not in shown
    problems = info.value.problems
    for key in ("storage.access_key_id", "storage.secret_access_key", "storage.session_token",
                "trainer.env.HF_TOKEN", "trainer.env.WANDB_API_KEY"):
        assert f"{key} = *** (a secret: its value is not shown): " in shown, problems
    assert "storage.region = 5: " in shown  # what is not secret is shown as before
    assert "trainer.env.PLAIN = 7: " in shown
    assert "vllm.health.url = ['http://u:***@127.0.0.1:8001/health']: " in shown
    assert ("storage.endpoint_url = 'http://admin:***@127.0.0.1:8333': must not hold a user "
            "or password") in shown
    with pytest.raises(ConfigError) as info:
        config.validate({"run": {"name": "r", "output_dir": str(tmp_path / "out")},
                         "storage": {"type": "hf", "repo_id": "org/ckpts", "token": 123,
                                     "endpoint": ["https://u:pa55-hf@hub.example"]}})
    assert info.value.problems == [
        "storage.endpoint = ['https://u:***@hub.example']: Input should be a valid string",
        "storage.token = *** (a secret: its value is not shown): Input should be a valid string",
    ]
    monkeypatch.setenv("TRAIND_STORAGE", "type=s3 secret_access_key=env-secret")
    monkeypatch.setenv("TRAIND_TRAINER", '{"command": ["t"], "env": "HF_TOKEN=env-token"}')
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL))
    assert "env-secret" not in str(info.value)
    assert "env-token" not in str(info.value)
    assert info.value.problems[0].startswith(
        "storage (from $TRAIND_STORAGE) = *** (a secret: its value is not shown): ")


def test_an_override_naming_no_section_is_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in an override's section would otherwise be ignored without a word."""
    monkeypatch.setenv("TRAIND_RETENTON__KEEP_LAST", "3")
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL))
    assert info.value.problems == [
        "$TRAIND_RETENTON__KEEP_LAST: no section 'retenton' to override (sections: run, "
        "checkpoints, storage, retention, status, vllm, services, trainer)"
    ]


def test_a_backoff_above_its_cap_is_a_problem(tmp_path: Path) -> None:
    """backoff_initial > backoff_max would silently wait the cap every time."""
    text = MINIMAL + (
        '\n[trainer]\ncommand = ["t"]\nrestart = { backoff_initial = "10m", backoff_max = "1m" }\n'
    )
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text))
    assert info.value.problems == [
        "trainer.restart: backoff_initial (600 s) is above backoff_max (60 s)"
    ]


def test_min_free_space(tmp_path: Path) -> None:
    """checkpoints.min_free_space defaults to 1.5x the checkpoint size, takes a size or a
    multiple, and a bad value is a problem naming the key."""
    assert config.load(write(tmp_path, MINIMAL)).checkpoints.min_free_space == "1.5x"
    s = config.load(write(tmp_path, MINIMAL + '\n[checkpoints]\nmin_free_space = "20GiB"\n'))
    assert s.checkpoints.min_free_space == "20GiB"
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL + '\n[checkpoints]\nmin_free_space = "-2x"\n'))
    assert info.value.problems == [
        "checkpoints.min_free_space = '-2x': write a multiple of the checkpoint size such as "
        "'1.5x', or a size such as '20GiB'"
    ]


@pytest.mark.parametrize(("value", "ok"), [('"3s"', True), ('"10m"', True), ('"0s"', False),
                                           ('"500ms"', False), ('"-1m"', False)])
def test_claim_ttl_is_a_duration_of_a_second_or_more(
    tmp_path: Path, value: str, ok: bool
) -> None:
    """``[storage] claim_ttl`` (default ten minutes) takes a duration of at least 1 s."""
    assert config.load(write(tmp_path, MINIMAL)).storage.claim_ttl == 600.0
    text = MINIMAL + f"claim_ttl = {value}\n"
    if ok:
        assert config.load(write(tmp_path, text)).storage.claim_ttl >= 3.0
    else:
        with pytest.raises(ConfigError, match=r"storage\.claim_ttl"):
            config.load(write(tmp_path, text))


@pytest.fixture
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No scheduler's rank variable from the machine running the tests."""
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_one_node_by_default(tmp_path: Path, no_scheduler: pytest.MonkeyPatch) -> None:
    """run.nodes defaults to 1 and this host is rank 0, even under a scheduler."""
    no_scheduler.setenv("SLURM_NODEID", "4")
    s = config.load(write(tmp_path, MINIMAL))
    assert (s.run.nodes, s.run.node_rank) == (1, None)
    assert config.node_rank(s) == NodeRank(0, 1, "single node")


def test_several_nodes_take_the_rank_from_the_scheduler(
    tmp_path: Path, no_scheduler: pytest.MonkeyPatch
) -> None:
    """run.nodes = 2 without run.node_rank: the rank comes from the scheduler's variable."""
    no_scheduler.setenv("DSTACK_NODE_RANK", "1")
    s = config.load(write(tmp_path, MINIMAL.replace("[run]", "[run]\nnodes = 2")))
    assert config.node_rank(s) == NodeRank(1, 2, "$DSTACK_NODE_RANK")


def test_several_nodes_without_a_rank_is_a_problem(
    tmp_path: Path, no_scheduler: pytest.MonkeyPatch
) -> None:
    """run.nodes > 1 and no rank anywhere: the config is refused, saying how to set one."""
    no_scheduler.setenv("TRAIND_RUN__NODES", "3")
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL))
    [problem] = info.value.problems
    assert problem.startswith("run.nodes = 3 but no node rank: set run.node_rank")


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ("nodes = 0", "run.nodes = 0: Input should be greater than or equal to 1"),
        ("nodes = 2\nnode_rank = -1", "run.node_rank = -1: Input should be greater than or "
                                      "equal to 0"),
        ("nodes = 2\nnode_rank = 2", "run.node_rank = 2: not a node rank of run.nodes = 2 "
                                     "(allowed: 0..1)"),
    ],
)
def test_node_rank_outside_the_job_is_a_problem(
    tmp_path: Path, no_scheduler: pytest.MonkeyPatch, keys: str, problem: str
) -> None:
    """A node count below 1, or a rank not in 0..nodes-1, is one problem naming the key."""
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MINIMAL.replace("[run]", f"[run]\n{keys}")))
    assert info.value.problems == [problem]

"""The host side of a launch: where things go, and the shell that installs, starts, stops and
reads traind there. Pure string building; the flow runs these through ``run_remote``.

traind runs as a background service, one of two ways (``[install] service``):

- ``systemd`` when the host runs systemd and we are root (``auto`` picks it then): a unit
  ``traind-<name>.service`` with ``Restart=on-failure``; logs in the journal.
- ``nohup`` otherwise (containers, such as vast.ai's): ``setsid nohup`` in its own session, its
  pid in ``<root>/traind.pid`` (the process group to signal), logs appended to
  ``<root>/traind.log``. It survives our SSH session but not a host reboot.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DETECT = (
    'if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 '
    '&& [ "$(id -u)" = 0 ]; then echo systemd; else echo nohup; fi'
)


@dataclass(frozen=True)
class HostPaths:
    """A launch's files on the host, under one (absolute, once resolved) root directory."""

    root: str
    name: str

    @property
    def code(self) -> str:
        """The run's code (the service's working directory)."""
        return f"{self.root}/code"

    @property
    def lib(self) -> str:
        """The shipped traind package's parent (on PYTHONPATH)."""
        return f"{self.root}/lib"

    @property
    def config(self) -> str:
        """The installed traind config."""
        return f"{self.root}/traind.toml"

    @property
    def pulled(self) -> str:
        """Where ``traind pull`` restores on the host before we copy it home."""
        return f"{self.root}/pulled"

    @property
    def unit(self) -> str:
        """The systemd unit's name."""
        return f"traind-{self.name}"

    def env(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The environment traind runs with."""
        return {**extra, "PYTHONPATH": self.lib, "PYTHONUNBUFFERED": "1"}


def resolve_root(root: str) -> str:
    """Create ``root`` and print its absolute path."""
    return f"mkdir -p {shlex.quote(root)} && cd {shlex.quote(root)} && pwd -P"


def install_python(layout: HostPaths, python: str, venv: bool, requirements: Sequence[str]) -> str:
    """Make the interpreter ready (a venv with ``requirements`` if asked; it must be 3.11+)
    and print its absolute path."""
    check = f'"$PY" -c {shlex.quote("import sys; assert sys.version_info >= (3, 11), sys.version")}'
    if not venv:
        return f"PY=$(command -v {shlex.quote(python)}) && {check} && echo \"$PY\""
    v = f"{layout.root}/venv"
    pip = (f' && "$PY" -m pip install -q --disable-pip-version-check {shlex.join(requirements)}'
           if requirements else "")
    return (
        f"{shlex.quote(python)} -m venv --system-site-packages {shlex.quote(v)} "
        f"&& PY={shlex.quote(v + '/bin/python')} && {check}{pip} && echo \"$PY\""
    )


def check_config(layout: HostPaths, python: str) -> list[str]:
    """traind validates its config on the host, without probing storage."""
    return [python, "-m", "traind", "check-config", "--offline", "-c", layout.config]


def _unit(layout: HostPaths, python: str, env: Mapping[str, str], stop_timeout: float) -> str:
    """systemd/traind.service's service settings (notify, watchdog, stop order, limits)
    without its filesystem hardening, which would need the run's paths listed."""

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'

    argv = [python, "-m", "traind", "run", "-c", layout.config]
    return "\n".join([
        "[Unit]",
        f"Description=traind for launch {layout.name}",
        "Wants=network-online.target",
        "After=network-online.target",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"WorkingDirectory={layout.code}",  # the rest of the line; quotes not allowed
        f"Environment={' '.join(quoted(f'{k}={v}') for k, v in env.items())}",
        f"ExecStart={' '.join(quoted(a) for a in argv)}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "TimeoutStartSec=120",
        "WatchdogSec=60",
        "Restart=on-failure",
        "RestartSec=5",
        "KillMode=mixed",
        f"TimeoutStopSec={max(1, round(stop_timeout))}",
        "OOMPolicy=continue",
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=1048576",
        f"SyslogIdentifier={layout.unit}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def start(
    kind: str, layout: HostPaths, python: str, env: Mapping[str, str], *, ready_within: float,
    stop_timeout: float,
) -> str:
    """Start traind (unless it runs already) and wait until it logs ``daemon_ready``;
    exit 3 if it died, 4 if not ready in time (both print the log's tail)."""
    polls = max(1, round(ready_within / 0.5))
    log, pid = f"{layout.root}/traind.log", f"{layout.root}/traind.pid"
    if kind == "systemd":
        unit_path = f"/etc/systemd/system/{layout.unit}.service"
        unit = _unit(layout, python, env, stop_timeout)
        launch = (
            f"S=$(date +%s); printf %s {shlex.quote(unit)} > {unit_path} "
            f"&& systemctl daemon-reload && systemctl enable -q {layout.unit} "
            f"&& systemctl restart {layout.unit}"
        )
        new_lines = f"journalctl -u {layout.unit} -o cat --no-pager --since @$S"
        alive = f"systemctl is-active -q {layout.unit}"
    else:
        inner = 'echo $$ > "$1"; shift; exec "$@"'
        launch = (
            f"if [ -f {shlex.quote(pid)} ] && kill -0 \"$(cat {shlex.quote(pid)})\" 2>/dev/null; "
            f"then echo already running; exit 0; fi; "
            f"O=$(stat -c %s {shlex.quote(log)} 2>/dev/null || echo 0); "
            f"(cd {shlex.quote(layout.code)} && exec nohup setsid sh -c {shlex.quote(inner)} sh "
            f"{shlex.quote(pid)} {shlex.quote(python)} -m traind run "
            f"-c {shlex.quote(layout.config)}) >> {shlex.quote(log)} 2>&1 < /dev/null &"
        )
        new_lines = f"tail -c +$((O + 1)) {shlex.quote(log)}"
        alive = f"kill -0 \"$(cat {shlex.quote(pid)} 2>/dev/null)\" 2>/dev/null"
    return (
        f"{launch}\n"
        f"i=0; while [ $i -lt {polls} ]; do i=$((i + 1)); sleep 0.5; "
        f"if {new_lines} | grep -q '\"daemon_ready\"'; then exit 0; fi; "
        f"if ! {alive}; then {new_lines} | tail -n 20 >&2; exit 3; fi; done; "
        f"{new_lines} | tail -n 20 >&2; exit 4"
    )


def is_active(kind: str, layout: HostPaths) -> str:
    """Exits 0 while traind runs."""
    if kind == "systemd":
        return f"systemctl is-active -q {layout.unit}"
    pid = shlex.quote(f"{layout.root}/traind.pid")
    return f"kill -0 \"$(cat {pid} 2>/dev/null)\" 2>/dev/null"


def stop(kind: str, layout: HostPaths, timeout: float) -> str:
    """Stop traind (SIGTERM to its group, SIGKILL after ``timeout``) and remove its unit."""
    if kind == "systemd":
        path = f"/etc/systemd/system/{layout.unit}.service"
        return (f"systemctl disable -q --now {layout.unit} 2>/dev/null; rm -f {path}; "
                "systemctl daemon-reload")
    pid = shlex.quote(f"{layout.root}/traind.pid")
    polls = max(1, round(timeout / 0.5))
    return (
        f"P=$(cat {pid} 2>/dev/null) || exit 0; "
        f"if kill -0 \"$P\" 2>/dev/null; then kill -s TERM -- \"-$P\"; i=0; "
        f"while kill -0 \"$P\" 2>/dev/null; do i=$((i + 1)); "
        f"if [ $i -gt {polls} ]; then kill -s KILL -- \"-$P\"; echo killed >&2; break; fi; "
        f"sleep 0.5; done; fi; rm -f {pid}"
    )


def logs(kind: str, layout: HostPaths, lines: int, follow: bool) -> str:
    """Print the last ``lines`` of traind's log; with ``follow``, keep printing until it stops."""
    if kind == "systemd":
        base = f"journalctl -u {layout.unit} -o cat --no-pager -n {lines}"
        if not follow:
            return base
        return (f"{base} -f & J=$!; while systemctl is-active -q {layout.unit}; do sleep 2; "
                "done; sleep 1; kill $J")
    log = shlex.quote(f"{layout.root}/traind.log")
    pid = shlex.quote(f"{layout.root}/traind.pid")
    if not follow:
        return f"tail -n {lines} {log}"
    return (f"P=$(cat {pid} 2>/dev/null); if [ -n \"$P\" ] && kill -0 \"$P\" 2>/dev/null; "
            f"then exec tail -n {lines} -F --pid=\"$P\" {log} 2>/dev/null; "
            f"else exec tail -n {lines} {log}; fi")


def pull(layout: HostPaths, python: str, tag: str) -> str:
    """Restore checkpoint ``tag`` from the run's store into ``<root>/pulled``, verified;
    traind prints the restored directory."""
    argv = [python, "-m", "traind", "pull", "-c", layout.config, tag, layout.pulled]
    return f"rm -rf {shlex.quote(layout.pulled)} && {shlex.join(argv)}"

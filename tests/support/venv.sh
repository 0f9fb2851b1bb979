# The project's own environment, for demo/run.sh and tests/run.sh (sourced, bash).
#
# project_venv EXTRAS: create .venv in the checkout if missing (or $TRAIND_VENV), install the
# CPU build of torch and then `-e .[EXTRAS]` into it, and put its bin/ first on PATH. Nothing
# goes into the system or base Python. A second run costs a file comparison: pip runs again only
# when pyproject.toml, the interpreter or the extras asked for changed.
#
# system_tools: the system programs the tests use; installed with apt-get when root, otherwise
# named with the command that installs them (the tests that need them then skip, or fail in CI).

TRAIND_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TRAIND_VENV="${TRAIND_VENV:-$TRAIND_ROOT/.venv}"
TRAIND_TORCH="torch==2.13.0"  # first, so nothing pulls a CUDA build on a CPU-only machine

_say() { echo "== $*" >&2; }

_python() {
    # The first interpreter that is Python 3.11 or newer: $PYTHON if set, else the usual one
    # (stock Debian has python3 and no python).
    local candidate
    for candidate in ${PYTHON:-} python3 python python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
        then
            command -v "$candidate"
            return 0
        fi
    done
    echo "traind needs Python 3.11 or newer: none found as ${PYTHON:-python3} (set PYTHON=...)" >&2
    return 1
}

_create_venv() {
    local python
    python="$(_python)" || return 1
    _say "creating $TRAIND_VENV with $("$python" --version 2>&1)"
    if "$python" -m venv "$TRAIND_VENV"; then
        return 0
    fi
    rm -rf "$TRAIND_VENV"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        _say "no venv with $python; installing Debian's python3-venv and trying again"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends python3-venv >/dev/null \
            && "$python" -m venv "$TRAIND_VENV" && return 0
        rm -rf "$TRAIND_VENV"
    fi
    echo "cannot create a virtualenv with $python; on Debian/Ubuntu: sudo apt-get install" \
        "python3-venv (or set PYTHON to another Python 3.11+)" >&2
    return 1
}

project_venv() {
    local extras="$1" stamp="$TRAIND_VENV/.traind-installed" want have="" had="" extra
    [ -x "$TRAIND_VENV/bin/python" ] || _create_venv || return 1
    want="$({ cat "$TRAIND_ROOT/pyproject.toml"; echo "$TRAIND_ROOT $TRAIND_TORCH"
              "$TRAIND_VENV/bin/python" --version; } | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ]; then  # line 1: what was installed from; then one extra per line
        have="$(head -n 1 "$stamp")"
        had="$(tail -n +2 "$stamp" | tr '\n' ',')"
    fi
    for extra in ${extras//,/ }; do
        [[ ",$had" == *",$extra,"* ]] || have=""
    done
    if [ "$want" != "$have" ]; then
        # The extras installed before are refreshed with the rest.
        extras="$(tr ',' '\n' <<<"$had$extras" | sed '/^$/d' | sort -u | paste -sd, -)"
        _say "installing $TRAIND_TORCH and traind[$extras] into $TRAIND_VENV"
        "$TRAIND_VENV/bin/python" -m pip install -q --disable-pip-version-check "$TRAIND_TORCH" \
            && "$TRAIND_VENV/bin/python" -m pip install -q --disable-pip-version-check \
                -e "$TRAIND_ROOT[$extras]" || return 1
        { echo "$want"; tr ',' '\n' <<<"$extras"; } > "$stamp"
    fi
    export VIRTUAL_ENV="$TRAIND_VENV"
    export PATH="$TRAIND_VENV/bin:$PATH"
}

system_tools() {
    local missing=()
    [ -x /usr/sbin/sshd ] || command -v sshd >/dev/null || missing+=(openssh-server)
    [ -x /usr/lib/openssh/sftp-server ] || missing+=(openssh-sftp-server)
    command -v rsync >/dev/null || missing+=(rsync)
    [ -x /usr/sbin/dockerd ] || command -v dockerd >/dev/null || missing+=(docker.io)
    command -v ssh-keygen >/dev/null || missing+=(openssh-client)
    command -v systemd-analyze >/dev/null || missing+=(systemd)
    # The status page's browser test drives the system's Chromium (Playwright's own browser
    # download needs the internet).
    command -v chromium >/dev/null || missing+=(chromium)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            _say "installing system packages: ${missing[*]}"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
                || return
        else
            echo "NOT INSTALLED (system packages, needs root): ${missing[*]}" >&2
            echo "  install them with: sudo apt-get install ${missing[*]}" >&2
            echo "  until then the tests that need them are skipped (they fail when CI=true)" >&2
        fi
    fi
    command -v promtool >/dev/null || _promtool
}

_promtool() {
    # For `promtool check metrics`. Debian ships it only in prometheus, whose install would also
    # enable and start a Prometheus server: take the one program out of the package instead.
    local tmp ok=1
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        _say "installing promtool (from Debian's prometheus package) as /usr/local/bin/promtool"
        tmp="$(mktemp -d)"
        if (cd "$tmp" && { apt-get download -qq prometheus \
                || { apt-get update -qq && apt-get download -qq prometheus; }; } \
                && dpkg-deb -x prometheus_*.deb root) >/dev/null 2>&1; then
            install -m 0755 "$tmp/root/usr/bin/promtool" /usr/local/bin/promtool && ok=0
        fi
        rm -rf "$tmp"
        [ "$ok" = 0 ] && return 0
    fi
    echo "NOT INSTALLED: promtool (Debian package prometheus)" >&2
    echo "  install it with: sudo apt-get install prometheus (or put any promtool on PATH)" >&2
    echo "  until then the test that needs it is skipped (it fails when CI=true)" >&2
}

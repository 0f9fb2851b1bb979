#!/usr/bin/env bash
# One-command demo: traind starts a tiny real TRL training run on the CPU, streams each of its
# checkpoints to a local store as it is written, exits when training is done and everything
# is committed, and then lists the store. Installs what it needs into the checkout's .venv
# (CPU torch first; never the system Python); shows traind's log if the run fails.
set -euo pipefail
source "$(dirname "$0")/../tests/support/venv.sh"
project_venv train
here="$TRAIND_ROOT"
work="${DEMO_DIR:-$here/demo-run}"
python="$TRAIND_VENV/bin/python"

rm -rf "$work" && mkdir -p "$work"
work="$(cd "$work" && pwd)"  # absolute, as traind's directories must be (DEMO_DIR may be relative)
cat > "$work/traind.toml" <<TOML
[run]
name = "demo"
output_dir = "$work/out"
state_dir = "$work/state"

[checkpoints]
settle = "1s"

[storage]
type = "local"
path = "$work/store"

[retention]
keep_last = 3          # the store keeps the newest 3 ...
keep_every_steps = 4   # ... plus every 4th step
keep_local = 2

[status]
listen = "127.0.0.1:0" # any free port (the demo does not query it)

[trainer]              # traind starts the trainer, restarts it on failure, resumes it
command = ["$python", "$here/tests/support/tiny_train.py", "--output-dir", "$work/out",
           "--max-steps", "8", "--save-steps", "1", "--save-total-limit", "2",
           "--callback", "--resume"]
env = { HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false" }
TOML

echo "== traind run: starts the trainer and streams its checkpoints (log: $work/traind.log)"
if ! traind run -c "$work/traind.toml" > "$work/traind.log" 2>&1; then
    echo "== traind run failed; the end of its log ($work/traind.log):" >&2
    tail -n 40 "$work/traind.log" >&2
    exit 1
fi

echo "== commit events"
grep -h '"checkpoint_committed"' "$work/traind.log" | "$python" -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    tag, files, size, secs = e["tag"], e["files"], e["bytes"], e["seconds"]
    print(f"  {tag:14} {files:>2} files {size:>9} bytes  {secs:.3f}s")'
echo "== committed checkpoints now in the store (traind list; retention pruned the rest)"
traind list -c "$work/traind.toml"

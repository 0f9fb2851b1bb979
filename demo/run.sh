#!/usr/bin/env bash
# One-command demo: traind starts a tiny real TRL training run on the CPU, streams each of its
# checkpoints to a local store as it is written, exits when training is done and everything
# is committed, and then lists the store. Installs what it needs (CPU torch first).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="${DEMO_DIR:-$here/demo-run}"
python="${PYTHON:-python3}"

"$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore torch==2.13.0
"$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e "$here[train]"

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
traind run -c "$work/traind.toml" > "$work/traind.log" 2>&1

echo "== commit events"
grep -h '"checkpoint_committed"' "$work/traind.log" | "$python" -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    tag, files, size, secs = e["tag"], e["files"], e["bytes"], e["seconds"]
    print(f"  {tag:14} {files:>2} files {size:>9} bytes  {secs:.3f}s")'
echo "== committed checkpoints now in the store (traind list; retention pruned the rest)"
traind list -c "$work/traind.toml"

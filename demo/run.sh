#!/usr/bin/env bash
# One-command demo: a tiny real TRL training run on the CPU whose checkpoints traind streams
# to a local store, then lists. Installs what it needs (CPU torch first, then traind[train]).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="${DEMO_DIR:-$here/demo-run}"

python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -e "$here[train]"

rm -rf "$work" && mkdir -p "$work"
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
keep_last = 3
keep_local = 2
TOML

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
echo "== traind run (logs in $work/traind.log)"
traind run -c "$work/traind.toml" > "$work/traind.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT

echo "== training: 8 steps, a checkpoint every step, the trainer keeps 2"
python "$here/tests/support/tiny_train.py" --output-dir "$work/out" --max-steps 8 \
    --save-steps 1 --save-total-limit 2 --callback

sleep 3   # let the last checkpoint settle and commit
kill -TERM $daemon && wait $daemon || true
trap - EXIT

echo "== committed checkpoints (traind list)"
traind list -c "$work/traind.toml"
echo "== commit events"
grep -h '"checkpoint_committed"' "$work/traind.log" | python -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    print(f"  {e[\"tag\"]:14} {e[\"files\"]} files  {e[\"bytes\"]:>9} bytes  {e[\"seconds\"]}s")'

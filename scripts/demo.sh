#!/usr/bin/env bash
# Install OmniRT, start a controller and a worker, generate one image with tiny-sd, stop both.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== installing (first run takes a few minutes) =="
scripts/setup.sh controller,worker,bench

run=$(mktemp -d)
models=${OMNIRT_MODEL_DIR:-$HOME/.cache/omnirt/models}
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

echo "== starting omnirt-controller =="
.venv/bin/omnirt-controller --listen 127.0.0.1:0 >"$run/controller.log" 2>&1 &
pids+=($!)
address=""
for _ in $(seq 1 200); do
  address=$(sed -n 's/^omnirt-controller listening on //p' "$run/controller.log" | head -n 1)
  [ -n "$address" ] && break
  sleep 0.1
done
[ -n "$address" ] || { echo "controller did not start:"; cat "$run/controller.log"; exit 1; }
echo "controller on $address (logs in $run)"

echo "== starting omnirt-worker (legacy_call, cpu; builds tiny-sd into $models on first use) =="
.venv/bin/omnirt-worker --controller "$address" --model-dir "$models" >"$run/worker.log" 2>&1 &
pids+=($!)

echo "== omnirtctl generate =="
.venv/bin/omnirtctl --controller "$address" generate --model tiny-sd \
  --prompt "a lighthouse on a cliff at dusk" --seed 42 --out outputs
echo "== done; stopping the daemons =="

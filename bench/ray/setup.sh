#!/usr/bin/env bash
# Create the Ray Serve peer's own virtualenv for `python -m bench.suite --only peers`.
# Usage: bash bench/ray/setup.sh   (from anywhere; makes REPO/.venv-bench-ray)
# Ray stays out of OmniRT's dependencies and virtualenv: its protobuf/grpcio pins cannot clash.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
venv=${OMNIRT_BENCH_RAY_VENV:-.venv-bench-ray}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
log=$(mktemp)
install() { "$venv/bin/python" -m pip install --quiet "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }; }
install --upgrade pip
install -r bench/ray/requirements.txt
rm -f "$log"
"$venv/bin/python" -c 'import ray, diffusers, torch; print("ray", ray.__version__, "diffusers", diffusers.__version__, "torch", torch.__version__)'

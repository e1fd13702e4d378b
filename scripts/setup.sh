#!/usr/bin/env bash
# Create .venv (Python 3.11+) and install OmniRT into it with the given extras.
# Usage: scripts/setup.sh [EXTRAS]   e.g. scripts/setup.sh controller,worker,dev
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-controller,worker,bench}
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
log=$(mktemp)
# pip's output goes to a log that is shown only when the install fails.
install() { .venv/bin/python -m pip install --quiet "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }; }
install --upgrade pip
# torch is pinned (torch==2.13.0) in the [worker] extra; an unpinned torch would pull a CUDA build.
# Strict editable mode: a link tree under build/ that mypy can follow (the default import hook
# hides the package-dir mapping from it). Rerun this script after adding a module.
install -e ".[$extras]" --config-settings editable_mode=strict
rm -f "$log"

#!/usr/bin/env bash
# Install everything the checks need, then: proto lint/breaking/generated code, ruff, mypy, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh controller,worker,dev
if [ ! -x .tools/node_modules/.bin/buf ]; then
  npm install --silent --no-save --no-audit --no-fund --prefix .tools @bufbuild/buf@1.75.0 >/dev/null
fi
scripts/check_proto.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy sdk controller worker cli
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# Install everything the checks need, then: proto lint/breaking/generated code, ruff, mypy, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh controller,worker,dev
scripts/install_tools.sh   # buf, helm and the CRD validators, into .tools/
# promtool (Debian's prometheus package) checks the /metrics exposition; the metrics tests fall
# back to prometheus_client's parser where it cannot be installed.
if ! command -v promtool >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
    >/dev/null 2>&1 || echo "promtool could not be installed; metrics are checked with prometheus_client only"
fi
# chromium (Debian's) runs the web console's browser tests (Playwright drives it by path; its own
# browser downloads are never used); where it cannot be installed they skip, saying so, and
# under CI=true they fail.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation) \
    >/dev/null 2>&1 || echo "chromium could not be installed; the console's browser tests will fail under CI=true (they skip elsewhere)"
fi
scripts/check_proto.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# By import name through the editable link tree (build/): every module is checked once, as omnirt.*.
.venv/bin/mypy -p omnirt
# Two test processes (OMNIRT_TEST_PROCESSES; 0 = one, without xdist), each taking whole files, so
# a module's daemons and warm models stay in one process; most tests wait on daemons and torch
# runs one thread per process, so 2 cores keep both busy.
processes=${OMNIRT_TEST_PROCESSES:-2}
parallel=()
if [ "$processes" != 0 ]; then parallel=(-n "$processes" --dist loadfile); fi
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "${parallel[@]}" "$@"

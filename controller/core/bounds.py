"""Bounds on the size and range of a request, and the bounded quote of user text in errors.

Whatever the controller accepts it encodes again later: into the job's protobuf (GetJob,
ListJobs, the HTTP gateway), into a worker's Assignment (which upb parses at most 100 message
levels deep) and into error messages and trailing metadata (gRPC's default limit is 8 KiB).
A value that fitted the request but not one of those used to break every later reader: a
`timeout_ms` of 2**63-1 made the job's deadline overflow int64 and every ListJobs fail, an
`extra` 48 lists deep broke the worker's stream, a 100 KB model name quoted in the error
overflowed the metadata limit. Each bound below keeps its field well inside all of them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from omnirt._internal.limits import ECHO_CHARS, MAX_ADAPTER_NAME_CHARS, MAX_ADAPTER_SCALE, MAX_FILE_NAME_BYTES
from omnirt._internal.original import BACKEND_LABEL, PINNED_BACKENDS
from omnirt.errors import InvalidRequest
from omnirt.types import GenerateRequest, ModelLimits

# Most characters of an error's field path and of its reason (a few hundred bytes of trailers).
MAX_FIELD_CHARS = 512
MAX_REASON_CHARS = 256
# Of the message naming several faults (each a field and its reason, joined by "; ").
MAX_MESSAGE_CHARS = 1024
# Job and worker ids a request names: the controller's own job ids are 20 characters; a worker
# id is often its pod name (deploy/k8s), which Kubernetes allows 253 characters.
MAX_ID_CHARS = 256
# Model ids and aliases (a Hugging Face hub id "org/name" is at most 96 characters).
MAX_MODEL_NAME_CHARS = 256
# Scheduler (a diffusers class name), preset and output format names.
MAX_NAME_CHARS = 128
MAX_IDEMPOTENCY_KEY_CHARS = 256
# Labels are for filtering and dashboards, like Kubernetes labels (63 characters a part there).
MAX_LABELS = 32
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 256
# A request's LoRA adapters: more than the worker keeps loaded (8 by default) makes no sense.
MAX_ADAPTERS = 16
MAX_INPUTS = 16
MAX_URI_CHARS = 4096
MAX_MIME_TYPE_CHARS = 128
# `extra` is a google.protobuf.Struct: each level of nesting costs the Assignment two or three
# message levels (Value, then ListValue or Struct and its map entry) below its own five, and
# upb refuses more than 100. 16 levels is at most 53, and no pipeline argument nests that deep.
MAX_EXTRA_DEPTH = 16
# Characters of keys and strings in `extra`, plus 8 per other value (about its encoded size).
MAX_EXTRA_SIZE = 64 * 1024
MAX_EXTRA_KEY_CHARS = 128
# A Struct carries numbers as doubles: a larger integer would not come back the same.
MAX_EXTRA_INTEGER = 2**53
# clip_skip counts CLIP text-encoder layers to skip; the deepest in diffusers (OpenCLIP bigG) has 32.
MAX_CLIP_SKIP = 32
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# A relative timeout or an absolute deadline further ahead than this is a mistake (a job is kept
# an hour by default); it also keeps now + timeout_ms far inside int64 and datetime's range.
MAX_TIMEOUT_MS = 366 * 24 * 3600 * 1000
# Field paths in errors (and the `omnirt-error-field` metadata) are ASCII.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]{1,64}")


def echo(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` quoted for an error message: at most `limit` characters of it, then '...'."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def bad(name: str, reason: str) -> InvalidRequest:
    """INVALID_ARGUMENT naming the field `name`: both bounded, the field printable ASCII.

    The field travels in trailing metadata (printable ASCII only), the message as the status
    message (a trailer too): a path or a reason made of user text (runtime options name their
    own keys and values) is escaped and cut here, once for every error.
    """
    if not (name.isascii() and name.isprintable()):
        name = ascii(name)[1:-1]
    if len(name) > MAX_FIELD_CHARS:  # with the "...", as the interceptor would cut it otherwise
        name = name[: MAX_FIELD_CHARS - 3] + "..."
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS] + "..."
    return InvalidRequest(f"{name}: {reason}", field=name)


class Violations(list[InvalidRequest]):
    """The faults of one request, gathered in one pass so that one answer names them all.

    A check appends its fault (`found.append(bad(...))`) or, for a helper that raises, runs
    through `run`, and the next independent check goes on; `stop` raises what was found where
    later checks depend on what these checked. No `with` block per check: a context manager's
    enter and exit cost 0.16 us each time, and a request passes some thirty checks (a valid
    request's `validate` took 13.5 us before, 20 us with them, 14.7 us so); a try that raises
    nothing costs nothing in Python 3.11.
    """

    def run(self, check: Callable[..., None], *args: Any) -> None:
        """`check(*args)`, its InvalidRequest kept (any other error passes through)."""
        try:
            check(*args)
        except InvalidRequest as fault:
            self.append(fault)

    def error(self) -> InvalidRequest | None:
        """One InvalidRequest for everything found (None when nothing was): the first fault's
        field, every field once in `violations` (the first fault of each), the messages joined."""
        if len(self) <= 1:
            return self[0] if self else None
        faults: dict[str, InvalidRequest] = {}
        for fault in self:
            faults.setdefault(fault.field, fault)
        message = "; ".join(fault.message for fault in faults.values())
        if len(message) > MAX_MESSAGE_CHARS:  # every fault stays whole in `violations`
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        violations = [(fault.field, fault.message) for fault in faults.values()]
        return InvalidRequest(message, field=self[0].field, violations=violations)

    def stop(self, fault: InvalidRequest | None = None) -> None:
        """Raise what was found, and `fault`, if anything (the checks after this one depend on it)."""
        if fault is not None:
            self.append(fault)
        error = self.error()
        if error is not None:
            raise error


def check_length(name: str, value: str, limit: int) -> None:
    """INVALID_ARGUMENT naming `name` when `value` is longer than `limit` (0 = no limit)."""
    if limit and len(value) > limit:
        raise bad(name, f"at most {limit} characters (got {len(value)})")


def check_id(name: str, value: str) -> None:
    """A job or worker id of a request: bounded before anything looks it up or quotes it."""
    check_length(name, value, MAX_ID_CHARS)


def check_request(req: GenerateRequest, limits: ModelLimits, found: Violations | None = None) -> None:
    """Sizes of the strings, collections and extras of a request (its model is known).

    Each field's fault goes to `found` and the next field is checked; then what was found is
    raised (all of it: `found` may hold faults of checks before these)."""
    found = Violations() if found is None else found
    for name, value, limit in (
        ("prompt", req.prompt, limits.max_prompt_chars),
        ("negative_prompt", req.negative_prompt, limits.max_prompt_chars),
        ("scheduler", req.scheduler, MAX_NAME_CHARS),
        ("preset", req.preset, MAX_NAME_CHARS),
        ("output.format", req.output_format, MAX_NAME_CHARS),
        ("idempotency_key", req.idempotency_key, MAX_IDEMPOTENCY_KEY_CHARS),
    ):
        if limit and len(value) > limit:  # check_length's rule, without a call per field
            found.append(bad(name, f"at most {limit} characters (got {len(value)})"))
    found.run(_check_labels, req.labels)
    found.run(_check_adapters, req)
    found.run(_check_inputs, req, limits.max_input_bytes)
    found.run(check_extra, req.extra)
    found.run(check_extra_keys, req.extra)
    found.stop()


def check_labels(labels: dict[str, str]) -> None:
    """At most MAX_LABELS labels, keys and values bounded (a request's, a session's)."""
    _check_labels(labels)


def _check_labels(labels: dict[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        raise bad("labels", f"at most {MAX_LABELS} labels (got {len(labels)})")
    for key, value in labels.items():
        if len(key) > MAX_LABEL_KEY_CHARS:
            raise bad("labels", f"a key is at most {MAX_LABEL_KEY_CHARS} characters (got {echo(key)})")
        if len(value) > MAX_LABEL_VALUE_CHARS:  # the path is built only for an error
            raise bad(_path("labels", key), f"at most {MAX_LABEL_VALUE_CHARS} characters (got {len(value)})")
    pinned = labels.get(BACKEND_LABEL)
    if pinned is not None and pinned not in PINNED_BACKENDS:
        raise bad(
            BACKEND_FIELD,
            f"the backend to run on: one of {', '.join(PINNED_BACKENDS)} (got {echo(pinned)}); "
            "leave the label out to run on any",
        )


def _check_adapters(req: GenerateRequest) -> None:
    if len(req.adapters) > MAX_ADAPTERS:
        raise bad("adapters", f"at most {MAX_ADAPTERS} adapters (got {len(req.adapters)})")
    for i, adapter in enumerate(req.adapters):
        name = f"adapters[{i}].name"
        check_length(name, adapter.name, MAX_ADAPTER_NAME_CHARS)
        if not adapter.name.isprintable():
            raise bad(name, f"may not contain control characters (got {echo(adapter.name)})")
        parts = adapter.name.split("/")
        if ".." in parts:
            raise bad(name, f"may not contain '..' (got {echo(adapter.name)})")
        if any(len(p.encode()) > MAX_FILE_NAME_BYTES for p in parts):
            raise bad(name, f"each part of a path is at most {MAX_FILE_NAME_BYTES} bytes")
        if not (math.isfinite(adapter.scale) and abs(adapter.scale) <= MAX_ADAPTER_SCALE):
            raise bad(f"adapters[{i}].scale", f"must be within +-{MAX_ADAPTER_SCALE:g} (got {adapter.scale})")


def _check_inputs(req: GenerateRequest, max_bytes: int) -> None:
    if len(req.inputs) > MAX_INPUTS:
        raise bad("inputs", f"at most {MAX_INPUTS} inputs (got {len(req.inputs)})")
    for i, item in enumerate(req.inputs):
        check_length(f"inputs[{i}].uri", item.uri, MAX_URI_CHARS)
        check_length(f"inputs[{i}].mime_type", item.mime_type, MAX_MIME_TYPE_CHARS)
    total = sum(len(item.data) for item in req.inputs)
    if max_bytes and total > max_bytes:
        raise bad("inputs", f"at most {max_bytes} bytes of inline data for this model (got {total})")


class _Fault(Exception):
    """A bad value inside `extra`; each level it passes on the way out adds its key, so the path
    is built for the one bad value only (building it for every value doubled validate's time)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.keys: list[str | int] = []


# Request fields that are pipeline keywords too: `extra` may not set them (`check_extra`).
REQUEST_FIELDS = frozenset(
    {"prompt", "negative_prompt", "width", "height", "num_frames", "fps", "num_inference_steps"}
    | {"guidance_scale", "strength", "seed"}
)


def check_extra_keys(extra: dict[str, Any]) -> None:
    """A request's `extra` names no request field: as a pipeline keyword it would bypass the
    field's bounds (a width of 100000)."""
    for key in sorted(REQUEST_FIELDS.intersection(extra)):
        raise bad(f"extra.{key}", f"is a request field: set {key} itself, where its bounds apply")


def check_extra(extra: dict[str, Any]) -> None:
    """Depth, size and values of `extra`; the typed extras the worker knows (`clip_skip`, ...)."""
    try:
        size = _extra_size(extra, 1)
    except _Fault as fault:
        path = "extra"
        for key in reversed(fault.keys):
            path = _path(path, key)
        raise bad(path, fault.reason) from None
    if size > MAX_EXTRA_SIZE:
        raise bad("extra", f"at most {MAX_EXTRA_SIZE} characters of keys and strings")
    if "clip_skip" in extra:
        value = extra["clip_skip"]
        if not (_is_number(value) and float(value).is_integer() and 0 <= value <= MAX_CLIP_SKIP):
            raise bad("extra.clip_skip", f"must be an integer from 0 to {MAX_CLIP_SKIP} (got {shown(value)})")
    if "guidance_rescale" in extra:
        value = extra["guidance_rescale"]
        if not (_is_number(value) and 0 <= value <= 1):
            raise bad("extra.guidance_rescale", f"must be a number in [0, 1] (got {shown(value)})")


def _extra_size(value: Any, depth: int) -> int:
    """The size of one value of `extra` (see MAX_EXTRA_SIZE); _Fault when it is bad."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict | list):
        if depth > MAX_EXTRA_DEPTH:
            raise _Fault(f"nested more than {MAX_EXTRA_DEPTH} levels deep")
        size = 0
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and len(key) > MAX_EXTRA_KEY_CHARS:
                raise bad("extra", f"a key is at most {MAX_EXTRA_KEY_CHARS} characters (got {echo(key)})")
            if not isinstance(key, str | int):
                raise _Fault(f"keys must be strings (got {type(key).__name__})")
            try:
                size += _extra_size(item, depth + 1) + 8
            except _Fault as fault:
                fault.keys.append(key)
                raise
            if size > MAX_EXTRA_SIZE:  # stop early: the whole of a huge extra is never walked
                return size
        return size
    if isinstance(value, bool) or value is None:
        return 8
    if isinstance(value, int):
        if abs(value) > MAX_EXTRA_INTEGER:
            raise _Fault(f"integers are at most {MAX_EXTRA_INTEGER} in magnitude")
        return 8
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Fault(f"must be a finite number (got {value})")
        return 8
    raise _Fault(f"not a JSON value ({type(value).__name__})")


def _path(path: str, key: str | int) -> str:
    """`path.key` for a plain key, `path[N]` for a list index, `path["..."]` (ASCII) otherwise."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key[:ECHO_CHARS])}]"


# The field path of the label that pins a job to a backend, as errors name it.
BACKEND_FIELD = _path("labels", BACKEND_LABEL)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def shown(value: Any) -> str:
    """Any value a client sent, quoted for an error message: `echo` for text, else its repr, cut."""
    return echo(value) if isinstance(value, str) else repr(value)[:ECHO_CHARS]

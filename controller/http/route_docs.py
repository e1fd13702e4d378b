"""OpenAPI operations of the gateway's routes that are not transcoded RPCs (`openapi.py` uses them).

These routes speak OpenAI's shapes, raw streams or static files, so their schemas are written
here; the OmniRT fields the OpenAI routes also take are the `GenerateRequest` fields, by
reference. A route missing from `DOCS` is still listed, with a summary saying it is undocumented
(`tests/integration/test_openapi.py` fails on that).
"""

from __future__ import annotations

from typing import Any

from omnirt._internal import original

UNDOCUMENTED = "undocumented route"
_STRING: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer"}
OPENAI_IMAGE: dict[str, Any] = {
    "type": "object",
    "description": "OpenAI's image parameters; OmniRT's GenerateRequest fields (seed, negative_prompt, "
    "num_inference_steps, guidance_scale, extra, ...: #/components/schemas/omnirt.v1.GenerateRequest) "
    "may ride along",
    "properties": {
        "model": _STRING,
        "prompt": _STRING,
        "n": _INT,
        "size": {"type": "string", "examples": ["512x512"]},
        "response_format": {"type": "string", "enum": ["b64_json", "url"]},
        "output_format": {"type": "string", "enum": ["png", "jpeg", "webp"]},
        "output_compression": _INT,
    },
    "required": ["prompt"],
}
OPENAI_IMAGE_EDIT: dict[str, Any] = {
    "type": "object",
    "properties": {
        **OPENAI_IMAGE["properties"],
        "image": {"type": "string", "contentMediaType": "image/*"},
        "mask": {"type": "string", "contentMediaType": "image/png"},
    },
    "required": ["prompt", "image"],
}
OPENAI_IMAGES_RESPONSE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "created": _INT,
        "data": {
            "type": "array",
            "items": {"type": "object", "properties": {"b64_json": _STRING, "url": _STRING}},
        },
        "output_format": _STRING,
        "size": _STRING,
    },
}
OPENAI_VIDEO: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": _STRING,
        "object": {"const": "video"},
        "model": _STRING,
        "status": {"type": "string", "enum": ["queued", "in_progress", "completed", "failed"]},
        "progress": _INT,
        "created_at": _INT,
        "seconds": _STRING,
        "size": _STRING,
        "error": {"type": ["object", "null"]},
    },
}
OPENAI_VIDEO_CREATE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": _STRING,
        "prompt": _STRING,
        "seconds": {"type": ["string", "number"]},
        "size": _STRING,
        "input_reference": {"type": "string", "contentMediaType": "image/*"},
    },
    "required": ["prompt"],
}
OPENAI_SPEECH: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": _STRING,
        "input": {"type": "string", "maxLength": 4096},
        "voice": {"oneOf": [_STRING, {"type": "object", "properties": {"id": _STRING}}]},
        "response_format": _STRING,
        "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0},
        "stream_format": {"type": "string", "enum": ["audio", "sse"]},
    },
    "required": ["model", "input", "voice"],
}
OPENAI_MODEL: dict[str, Any] = {
    "type": "object",
    "properties": {"id": _STRING, "object": {"const": "model"}, "created": _INT, "owned_by": _STRING},
}


def _original_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/original.{name}"}


def _original_field(name: str) -> dict[str, Any]:
    """The JSON type of our request field `name`, as the original's `config` or `inputs` gives it."""
    if name == "seed":
        return {"oneOf": [_INT, {"const": "random"}]}
    if name in original.INT32_FIELDS:
        return _INT
    return {"type": "number"} if name in original.FLOAT32_FIELDS else _STRING


_ORIGINAL_NULLABLE_INT = {"type": ["integer", "null"]}
_RUNTIME_OPTION = {"description": "a runtime option (extra.runtime)"}
_PIPELINE_ARGUMENT = {"description": "the pipeline's own argument (extra)"}
ORIGINAL_SCHEMAS: dict[str, dict[str, Any]] = {
    "original.GenerateRequest": {
        "type": "object",
        "description": "The original OmniRT's request (its Service Schema 1.0.0), recognised by `inputs` "
        "as an object, `config`, `backend` or `async_run`, and answered in its shape (docs/http.md). A "
        "config key OmniRT sets elsewhere (model_path, device, dtype, ...) is refused naming `config.<key>`",
        "properties": {
            "task": {"type": "string", "enum": sorted(original.TASKS)},
            "model": _STRING,
            "backend": {"type": "string", "enum": list(original.BACKENDS)},
            "inputs": {
                "type": "object",
                "properties": {
                    **{k: _original_field(v) for k, v in original.INPUT_FIELDS.items()},
                    **{
                        k: {
                            "type": "string",
                            "description": "a data: URL, base64, a URL, or an absolute path "
                            "on the worker (under its --input-root)",
                        }
                        for k in original.INPUT_MEDIA
                    },
                },
                "additionalProperties": False,
            },
            "config": {
                "type": "object",
                "properties": {
                    **{k: _original_field(v) for k, v in original.CONFIG_FIELDS.items()},
                    **{k: _RUNTIME_OPTION for k in original.CONFIG_RUNTIME},
                    **{k: _PIPELINE_ARGUMENT for k in original.CONFIG_PIPELINE},
                },
                "additionalProperties": False,
            },
            "adapters": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "lora"},
                        "path": {"type": "string", "description": "a catalog adapter's name"},
                        "scale": {"type": "number"},
                    },
                    "required": ["path"],
                },
            },
            "async_run": {"type": "boolean", "description": "true: answer the job record, not the result"},
        },
        "required": ["model"],
        "additionalProperties": False,
    },
    "original.Output": {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["image", "video", "audio"]},
            "path": {
                "type": "string",
                "description": "the artifact's URL on this gateway (the original's server path)",
            },
            "url": _STRING,
            "mime": _STRING,
            "width": _ORIGINAL_NULLABLE_INT,
            "height": _ORIGINAL_NULLABLE_INT,
            "num_frames": _ORIGINAL_NULLABLE_INT,
        },
    },
    "original.GenerateResult": {
        "type": "object",
        "properties": {
            "outputs": {"type": "array", "items": _original_ref("Output")},
            "metadata": {
                "type": "object",
                "description": "the original's RunReport (timings in seconds)",
                "properties": {
                    "run_id": _STRING,
                    "job_id": _STRING,
                    "task": _STRING,
                    "model": _STRING,
                    "backend": _STRING,
                    "trace_id": _STRING,
                    "worker_id": _STRING,
                    "timings": {"type": "object", "additionalProperties": {"type": "number"}},
                    "schema_version": {"const": original.SCHEMA_VERSION},
                },
            },
        },
        "required": ["outputs", "metadata"],
    },
    "original.Job": {
        "type": "object",
        "properties": {
            "id": _STRING,
            "state": {"type": "string", "enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
            "trace_id": _STRING,
            "backend": _STRING,
            "worker_id": {"type": ["string", "null"]},
            "error": {"type": ["string", "null"]},
            "enqueued_at_ms": _ORIGINAL_NULLABLE_INT,
            "started_at_ms": _ORIGINAL_NULLABLE_INT,
            "finished_at_ms": _ORIGINAL_NULLABLE_INT,
            "request": {**_original_ref("GenerateRequest"), "description": "in the answer to the submission"},
            "result": _original_ref("GenerateResult"),
            "execution_mode": _STRING,
        },
        "required": ["id", "state", "trace_id"],
    },
    "original.Event": {
        "type": "object",
        "properties": {
            "event": {"type": "string", "examples": ["job_enqueued", "stage_start", "stage_progress"]},
            "stage": _STRING,
            "timestamp_ms": _INT,
            "data": {"type": "object"},
        },
        "required": ["event", "stage", "timestamp_ms", "data"],
    },
    "original.Trace": {
        "type": "object",
        "properties": {
            "trace_id": _STRING,
            "job_id": _STRING,
            "task": _STRING,
            "model": _STRING,
            "created_at_ms": _ORIGINAL_NULLABLE_INT,
            "worker_id": {"type": ["string", "null"]},
            "state": _STRING,
            "error": {"type": ["string", "null"]},
            "events": {"type": "array", "items": _original_ref("Event")},
            "spans": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["trace_id", "job_id", "state", "events", "spans"],
    },
}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(schema: dict[str, Any], *, multipart: bool = False) -> dict[str, Any]:
    content = {"application/json": {"schema": schema}}
    if multipart:
        content["multipart/form-data"] = {"schema": schema}
    return {"required": True, "content": content}


def _open(summary: str, content_type: str, tag: str = "Gateway") -> dict[str, Any]:
    """A route that needs no key."""
    ok = {"description": "OK", "content": {content_type: {"schema": {"type": "string"}}}}
    return {"summary": summary, "tags": [tag], "security": [], "responses": {"200": ok}}


def _docs() -> dict[tuple[str, str], dict[str, Any]]:
    image = OPENAI_IMAGE
    videos = {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": OPENAI_VIDEO}},
    }
    models = {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": OPENAI_MODEL}},
    }
    return {
        ("GET", "/"): _open(
            "The web console (static HTML; its calls use the API with the user's key)", "text/html", "Console"
        ),
        ("GET", "/console/{name}"): _open("The console's scripts and styles", "text/javascript", "Console"),
        ("GET", "/openapi.json"): _open("This document", "application/json"),
        ("GET", "/healthz"): {
            **_open("Readiness: SERVING with the number of workers, or 503 NOT_SERVING", "application/json"),
            "responses": {"200": _json({"type": "object"}), "503": _json({"type": "object"}, "not serving")},
        },
        ("GET", "/metrics"): {
            **_open("Prometheus metrics (an admin key with --metrics-auth)", "text/plain"),
            "security": [{}, {"bearer": []}],
        },
        ("GET", "/v1/models"): {
            "summary": "OpenAI: list models",
            "tags": ["OpenAI"],
            "responses": {"200": _json(models)},
        },
        ("GET", "/v1/models/{model}"): {
            "summary": "OpenAI: one model",
            "tags": ["OpenAI"],
            "responses": {"200": _json(OPENAI_MODEL)},
        },
        ("POST", "/v1/images/generations"): {
            "summary": "OpenAI: text2image",
            "tags": ["OpenAI"],
            "requestBody": _body(image),
            "responses": {"200": _json(OPENAI_IMAGES_RESPONSE)},
        },
        ("POST", "/v1/images/edits"): {
            "summary": "OpenAI: image2image, or inpaint with a mask",
            "tags": ["OpenAI"],
            "requestBody": _body(OPENAI_IMAGE_EDIT, multipart=True),
            "responses": {"200": _json(OPENAI_IMAGES_RESPONSE)},
        },
        ("POST", "/v1/videos"): {
            "summary": "OpenAI: start a video job (text2video, or image2video with input_reference)",
            "tags": ["OpenAI"],
            "requestBody": _body(OPENAI_VIDEO_CREATE, multipart=True),
            "responses": {"200": _json(OPENAI_VIDEO)},
        },
        ("GET", "/v1/videos"): {
            "summary": "OpenAI: the caller's video jobs",
            "tags": ["OpenAI"],
            "responses": {"200": _json(videos)},
        },
        ("GET", "/v1/videos/{video_id}"): {
            "summary": "OpenAI: one video job",
            "tags": ["OpenAI"],
            "responses": {"200": _json(OPENAI_VIDEO)},
        },
        ("DELETE", "/v1/videos/{video_id}"): {
            "summary": "OpenAI: cancel a video job",
            "tags": ["OpenAI"],
            "responses": {
                "200": _json(
                    {"type": "object", "properties": {"id": _STRING, "deleted": {"type": "boolean"}}}
                )
            },
        },
        ("GET", "/v1/videos/{video_id}/content"): {
            "summary": "OpenAI: the finished video's bytes",
            "tags": ["OpenAI"],
            "responses": {"200": {"description": "video/mp4", "content": {"video/mp4": {"schema": {}}}}},
        },
        ("POST", "/v1/audio/speech"): {
            "summary": "OpenAI: text2audio (the audio file, or speech.audio.* events with stream_format sse)",
            "tags": ["OpenAI"],
            "requestBody": _body(OPENAI_SPEECH),
            "responses": {
                "200": {
                    "description": "the audio",
                    "content": {"audio/*": {"schema": {}}, "text/event-stream": {"schema": _STRING}},
                }
            },
        },
        ("GET", "/v1/jobs/{job_id}/trace"): {
            "summary": "The original OmniRT's trace view of a job: its events and stage spans (a live "
            "job's events so far)",
            "tags": ["GenerationService"],
            "responses": {"200": _json(_original_ref("Trace"))},
        },
        ("GET", "/v1/avatar/realtime"): {
            "summary": "Realtime avatar session over a WebSocket (docs/realtime.md): session.create, "
            "b'AUDI'+PCM s16le in, b'VIDX' frames out. A browser sends its key as the subprotocol "
            "omnirt.bearer.BASE64URL(KEY) next to omnirt.v1",
            "tags": ["RealtimeService"],
            "responses": {"101": {"description": "Switching Protocols (WebSocket)"}},
        },
    }


def operation(method: str, path: str) -> dict[str, Any]:
    """The operation of a route that is not a transcoded RPC (a copy: the caller may change it)."""
    found = _docs().get((method, path))
    if found is None:
        return {"summary": UNDOCUMENTED, "tags": ["Undocumented"]}
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in found.items()}

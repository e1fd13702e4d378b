"""OpenAI-compatible speech: `POST /v1/audio/speech` runs one text2audio `Generate`.

OpenAI's parameters map to the request: `input` is the prompt (at most 4096 characters, as
OpenAI's), `response_format` the output format (mp3 by default, as OpenAI's; the worker's
audio formats decide which others exist), `speed` becomes `extra.speed` (0.25 to 4.0; a model
that cannot take it refuses naming it), `voice` is required (a name, or OpenAI's `{"id": ...}`)
and is recorded in the job's labels: the models served here have one voice each, which speaks
whatever voice is asked. `instructions` is refused: no model here takes any. OmniRT's own
fields ride along as extra body fields (`seed`, `preset`, `timeout_ms`, `priority`, `extra`).

The answer is the audio file itself, sent in chunks as it is read (`stream_format = "audio"`,
the default; the official client's `with_streaming_response` reads it as it comes), or, with
`stream_format = "sse"`, OpenAI's events: `speech.audio.delta` with base64 chunks, then
`speech.audio.done` with the usage. Either way the job runs to its end first: the audio
starts once the whole clip is made (a realtime session streams it as it is made).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from omnirt._internal import convert as _convert
from omnirt.controller.core.artifact_store import artifact_bytes
from omnirt.controller.core.bounds import shown
from omnirt.controller.edges.auth import caller
from omnirt.controller.http.errors import bad_request
from omnirt.controller.http.openai_params import INT32, INT64, Params, read_params
from omnirt.controller.http.transcode import Gateway
from omnirt.types import GenerateRequest, Task
from omnirt.v1 import generation_pb2

MAX_INPUT_CHARS = 4096  # OpenAI's limit on `input`
MAX_VOICE_CHARS = 64
SPEED = (0.25, 4.0)
DEFAULT_FORMAT = "mp3"
STREAM_FORMATS = ("audio", "sse")
CHUNK_BYTES = 64 * 1024
# Every answer carries the audio itself, whatever the server's inline limit.
INLINE_LIMIT = 1 << 62


def register(app: web.Application, gateway: Gateway) -> None:
    async def speech(request: web.Request) -> web.StreamResponse:
        params, _ = await read_params(request, multipart=False)
        stream_format = params.choice("stream_format", STREAM_FORMATS, "audio")
        req = speech_request(params)
        msg = _convert.request_to_proto(req)
        rpc = "GenerationService.Generate"
        answer: generation_pb2.GenerateResponse = await gateway.call(rpc, msg, request)
        result = _convert.result_from_proto(answer.result)
        if not result.artifacts:
            raise bad_request("the model made no audio", "model")
        artifact = result.artifacts[0]
        # The job was made by this caller just now; its artifact is still read in its scope.
        audio = artifact.data
        if not audio:
            audio = await artifact_bytes(
                gateway.engine, gateway.artifacts, answer.job.id, artifact.index, caller().scope
            )
        headers = {
            "X-OmniRT-Job-Id": answer.job.id,
            "X-OmniRT-Sample-Rate": str(artifact.sample_rate),
            "X-OmniRT-Duration-Ms": str(artifact.duration_ms),
        }
        if stream_format == "sse":
            return await _send_events(request, audio, req.prompt, headers)
        headers["Content-Type"] = artifact.mime_type or "application/octet-stream"
        response = web.StreamResponse(headers=headers)
        response.content_length = len(audio)
        await response.prepare(request)
        for start in range(0, len(audio), CHUNK_BYTES):
            await response.write(audio[start : start + CHUNK_BYTES])
        await response.write_eof()
        return response

    app.router.add_post("/v1/audio/speech", speech, expect_handler=gateway.expect_continue)


def speech_request(params: Params) -> GenerateRequest:
    """OpenAI's speech parameters as a text2audio request (a 400 naming the parameter when wrong)."""
    text = params.text("input", required=True)
    if len(text) > MAX_INPUT_CHARS:
        raise bad_request(f"at most {MAX_INPUT_CHARS} characters (got {len(text)})", "input")
    if params.text("instructions"):
        raise bad_request("no speech model here takes instructions", "instructions")
    req = GenerateRequest(
        model=params.text("model", required=True),
        task=Task.TEXT2AUDIO,
        prompt=text,
        seed=params.integer("seed", minimum=INT64[0], maximum=INT64[1]),
        preset=params.text("preset"),
        priority=params.integer("priority") or 0,
        timeout_ms=params.integer("timeout_ms", minimum=0, maximum=INT64[1]) or 0,
        idempotency_key=params.text("idempotency_key"),
        output_format=params.text("response_format", DEFAULT_FORMAT).lower(),
        labels={"voice": _voice(params)},
        inline_limit_bytes=INLINE_LIMIT,
    )
    extra = params.data.get("extra")
    if extra is not None:
        if not isinstance(extra, dict):
            raise bad_request("must be an object", "extra")
        req.extra = dict(extra)
    speed = params.number("speed")
    if speed is not None:
        if not SPEED[0] <= speed <= SPEED[1]:
            raise bad_request(f"must be from {SPEED[0]} to {SPEED[1]} (got {shown(speed)})", "speed")
        if speed != 1.0:
            req.extra["speed"] = speed
    duration_ms = params.integer("duration_ms", minimum=1, maximum=INT32[1])
    if duration_ms is not None:  # an OmniRT extra: a clip length for the models that take one
        req.duration_ms = duration_ms
    return req


def _voice(params: Params) -> str:
    value = params.data.get("voice")
    if isinstance(value, dict):  # OpenAI's custom voice object
        value = value.get("id")
    if value in (None, ""):
        raise bad_request("required", "voice")
    if not isinstance(value, str):
        raise bad_request(f"must be a string or an object with an id (got {type(value).__name__})", "voice")
    if len(value) > MAX_VOICE_CHARS or not value.isprintable():
        raise bad_request(f"a printable name of at most {MAX_VOICE_CHARS} characters", "voice")
    return value


async def _send_events(
    request: web.Request, audio: bytes, text: str, headers: dict[str, str]
) -> web.StreamResponse:
    headers = {**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    for start in range(0, len(audio), CHUNK_BYTES):
        chunk = base64.b64encode(audio[start : start + CHUNK_BYTES]).decode()
        await response.write(_event({"type": "speech.audio.delta", "audio": chunk}))
    # OmniRT counts no tokens: input_tokens is the input's characters, output_tokens 0.
    usage = {"input_tokens": len(text), "output_tokens": 0, "total_tokens": len(text)}
    await response.write(_event({"type": "speech.audio.done", "usage": usage}))
    await response.write_eof()
    return response


def _event(body: dict[str, Any]) -> bytes:
    return f"event: {body['type']}\ndata: {json.dumps(body)}\n\n".encode()

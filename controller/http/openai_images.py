"""OpenAI-compatible images: `POST /v1/images/generations` and `POST /v1/images/edits`.

Both run one `Generate` (the same servicer as gRPC) and answer OpenAI's `ImagesResponse`:
`data[i].b64_json` (the default) or `data[i].url` (this gateway's
`/v1/jobs/{id}/artifacts/{i}`, valid while the job is kept). An edit with a `mask` is an
inpaint, without one an image2image.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from aiohttp import web

from omnirt._internal import convert as _convert
from omnirt.controller.core.artifact_store import artifact_bytes
from omnirt.controller.edges.auth import caller
from omnirt.controller.http.errors import bad_request
from omnirt.controller.http.openai_params import Params, generate_request, png_size, read_params, sniff_image
from omnirt.controller.http.transcode import Gateway, artifact_url
from omnirt.types import GenerateRequest, MediaInput, MediaRole, Task
from omnirt.v1 import generation_pb2  # the edge builds its own request messages, like a servicer

RESPONSE_FORMATS = ("b64_json", "url")
# b64_json answers carry every image inline, whatever the server's inline limit.
B64_INLINE_LIMIT = 1 << 62


def register(app: web.Application, gateway: Gateway) -> None:
    async def generations(request: web.Request) -> web.Response:
        params, _ = await read_params(request, multipart=False)
        req = generate_request(params, Task.TEXT2IMAGE)
        return await _run(gateway, request, params, req)

    async def edits(request: web.Request) -> web.Response:
        params, files = await read_params(request, multipart=True)
        images, masks = files.get("image", []), files.get("mask", [])
        if not images:
            raise bad_request("required: the image to edit, as a file", "image")
        if len(images) > 1 or len(masks) > 1:
            raise bad_request(
                "one image (and at most one mask) per request", "image" if len(images) > 1 else "mask"
            )
        image = images[0]
        inputs = [MediaInput(MediaRole.IMAGE, data=image, mime_type=_image_mime(image, "image"))]
        if masks:
            inputs.append(MediaInput(MediaRole.MASK, data=masks[0], mime_type=_image_mime(masks[0], "mask")))
        req = generate_request(params, Task.INPAINT if masks else Task.IMAGE2IMAGE)
        req.inputs = inputs
        if req.width is None and (size := png_size(image)) and not (size[0] % 8 or size[1] % 8):
            req.width, req.height = size  # keep the input's size when it suits the model
        return await _run(gateway, request, params, req)

    app.router.add_post("/v1/images/generations", generations, expect_handler=gateway.expect_continue)
    app.router.add_post("/v1/images/edits", edits, expect_handler=gateway.expect_continue)


def _image_mime(data: bytes, field: str) -> str:
    mime = sniff_image(data)
    if not mime:
        raise bad_request("not a PNG, JPEG, WEBP or GIF image", field)
    return mime


async def _run(gateway: Gateway, request: web.Request, params: Params, req: GenerateRequest) -> web.Response:
    response_format = params.choice("response_format", RESPONSE_FORMATS, "b64_json")
    if response_format == "b64_json":
        req.inline_limit_bytes = B64_INLINE_LIMIT
    msg = _convert.request_to_proto(req)
    answer: generation_pb2.GenerateResponse = await gateway.call("GenerationService.Generate", msg, request)
    result = _convert.result_from_proto(answer.result)
    data: list[dict[str, Any]] = []
    for artifact in result.artifacts:
        if response_format == "url":
            data.append({"url": artifact_url(request, answer.job.id, artifact.index)})
        else:
            # The job was made by this caller just now; its artifact is still read in its scope.
            scope = caller().scope
            raw = artifact.data or await artifact_bytes(
                gateway.engine, gateway.artifacts, answer.job.id, artifact.index, scope
            )
            data.append({"b64_json": base64.b64encode(raw).decode()})
    body: dict[str, Any] = {"created": int(time.time()), "data": data}
    if result.artifacts:
        first = result.artifacts[0]
        body["output_format"] = first.mime_type.removeprefix("image/")
        body["size"] = f"{first.width}x{first.height}"
    return web.json_response(body)

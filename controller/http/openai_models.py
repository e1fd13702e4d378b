"""OpenAI-compatible models: `GET /v1/models` and `GET /v1/models/{model}`, in OpenAI's shape.

`client.models.list()` reads `{"object": "list", "data": [Model]}` and `client.models.retrieve(id)`
one `Model`, `{"id", "object": "model", "created", "owned_by"}`; an unknown id is a 404 in
OpenAI's error shape (`code` `model_not_found`). Both call the same `ListModels` and
`DescribeModel` as gRPC; the full `ModelSpec` (tasks, defaults, limits, serving workers) stays
at `/v1/omnirt/models`.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from omnirt.controller.http.transcode import Gateway, build_request

OWNER = "omnirt"


def register(app: web.Application, gateway: Gateway) -> None:
    # `created`: when this controller started. The catalog has no date per model; this one is
    # the same for every model and every call for the controller's life.
    created = int(time.time())

    def model_object(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": created, "owned_by": OWNER}

    async def listing(request: web.Request) -> web.Response:
        rpc = "ModelService.ListModels"
        msg = build_request("", gateway.request_type(rpc), {}, {}, None)
        answer = await gateway.call(rpc, msg, request)
        return web.json_response({"object": "list", "data": [model_object(m.id) for m in answer.models]})

    async def retrieve(request: web.Request) -> web.Response:
        rpc = "ModelService.DescribeModel"
        msg = build_request("", gateway.request_type(rpc), {"model": request.match_info["model"]}, {}, None)
        answer = await gateway.call(rpc, msg, request)
        return web.json_response(model_object(answer.model.id))  # an alias answers the model's id

    app.router.add_get("/v1/models", listing)
    app.router.add_get("/v1/models/{model}", retrieve)

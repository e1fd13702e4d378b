"""`GET /openapi.json` from a real controller: every route the gateway registers is in it, it is a
valid OpenAPI 3.1 document, and the gateway's real answers fit the schemas it states (proto3 JSON:
int64 as strings, enums by name, bytes as base64)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from jsonschema import Draft202012Validator

from omnirt.controller.edges.auth import key_digest
from omnirt.controller.http.app import HttpGateway
from omnirt.controller.http.route_docs import UNDOCUMENTED
from omnirt.v1 import realtime_pb2
from tests.daemons import Controller

KEY = "sk-openapi-user-0123456789abcdef"
REALTIME = realtime_pb2.DESCRIPTOR.services_by_name["RealtimeService"].full_name


def registered_routes() -> set[tuple[str, str]]:
    """(method, path) of every route a gateway registers, the realtime WebSocket included."""
    servicers = {REALTIME: SimpleNamespace(manager=None)}
    gateway = HttpGateway(cast(Any, None), cast(Any, None), servicers, "127.0.0.1:0", 1024)
    found = set()
    for route in gateway.app.router.routes():
        if route.resource is not None and route.method != "HEAD":
            found.add((route.method.lower(), route.resource.canonical))
    return found


@pytest.fixture(scope="module")
def controller(
    log_dir: Path, user_catalog: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'[[keys]]\ntenant = "alice"\nrole = "user"\nsha256 = "{key_digest(KEY)}"\n')
    daemon = Controller(log_dir, "--catalog", str(user_catalog), "--auth-keys", str(keys), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def document(http: httpx.Client) -> dict[str, Any]:
    r = http.get("/openapi.json")  # no key: the document holds no data
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    return cast(dict[str, Any], r.json())


def check(document: dict[str, Any], schema_name: str, value: Any) -> None:
    """Validate `value` against a component of the document (JSON Schema 2020-12, as OAS 3.1)."""
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": document["components"]}
    Draft202012Validator(schema).validate(value)


def test_every_registered_route_is_documented(document: dict[str, Any]) -> None:
    documented = {(m, p) for p, ops in document["paths"].items() for m in ops}
    routes = registered_routes()
    assert ("get", "/v1/avatar/realtime") in routes and ("get", "/openapi.json") in routes
    assert routes == documented
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert op["summary"] != UNDOCUMENTED, (method, path)
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"\{(\w+)\}", path)), (method, path)


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    from openapi_spec_validator import validate

    assert document["openapi"] == "3.1.0"
    validate(document)
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))


def test_schemas_follow_the_proto3_json_mapping(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    request = schemas["omnirt.v1.GenerateRequest"]["properties"]
    assert request["seed"] == {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"}
    assert request["width"]["type"] == "integer"
    assert request["task"]["enum"][:2] == ["TASK_UNSPECIFIED", "TASK_TEXT2IMAGE"]
    assert request["inputs"]["items"] == {"$ref": "#/components/schemas/omnirt.v1.MediaInput"}
    assert request["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert request["extra"] == {"type": "object"}
    assert schemas["omnirt.v1.MediaInput"]["properties"]["data"]["contentEncoding"] == "base64"
    assert schemas["omnirt.v1.Job"]["properties"]["created_at"]["format"] == "date-time"
    submit = document["paths"]["/v1/jobs"]["post"]
    body = submit["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/omnirt.v1.GenerateRequest"}  # body = "request"
    listing = {p["name"]: p for p in document["paths"]["/v1/jobs"]["get"]["parameters"]}
    assert listing["states"]["schema"]["items"]["enum"][1] == "JOB_STATE_QUEUED"
    assert document["paths"]["/v1/workers"]["get"]["description"] == "Needs an admin key."
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert document["security"] == [{"bearer": []}]


def test_real_answers_fit_their_schemas(http: httpx.Client, document: dict[str, Any]) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    models = http.get("/v1/omnirt/models", headers=headers)
    assert models.status_code == 200
    check(document, "omnirt.v1.ListModelsResponse", models.json())
    request = {"model": "unserved-sd", "prompt": "a fox", "seed": "7", "labels": {"from": "openapi"}}
    check(document, "omnirt.v1.GenerateRequest", request)
    submitted = http.post("/v1/jobs", json=request, headers=headers)
    assert submitted.status_code == 202, submitted.text
    check(document, "omnirt.v1.SubmitResponse", submitted.json())
    job_id = submitted.json()["job"]["id"]
    check(document, "omnirt.v1.GetJobResponse", http.get(f"/v1/jobs/{job_id}", headers=headers).json())
    cancelled = http.delete(f"/v1/jobs/{job_id}", headers=headers)
    check(document, "omnirt.v1.CancelJobResponse", cancelled.json())
    error = http.get("/v1/jobs/job-0000000000000000", headers=headers)
    assert error.status_code == 404
    check(document, "Error", error.json())
    with pytest.raises(Exception, match="is not of type 'string'"):
        check(document, "omnirt.v1.GenerateRequest", {**request, "prompt": 3})

"""The HTTP edge's refusal answers without a server: their statuses, headers and two shapes."""

from __future__ import annotations

import json

import pytest

from omnirt import errors
from omnirt.controller.http.errors import HttpError, error_response
from omnirt.controller.http.security import Cors, rpc_level
from omnirt.controller.http.transcode import ROUTES


@pytest.mark.parametrize(("retry_after_s", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (2.1, "3")])
def test_quota_and_queue_refusals_are_429_with_whole_seconds(retry_after_s: float, header: str) -> None:
    for kind in (errors.QuotaExceeded, errors.QueueFull):
        error = kind("used up", retry_after_s=retry_after_s)
        response = error_response(error)
        assert response.status == 429 and response.headers["Retry-After"] == header
        openai = json.loads(error_response(error, openai=True).text or "{}")
        assert openai["error"]["type"] == "rate_limit_error"


def test_auth_refusals_are_401_with_a_challenge_and_403() -> None:
    response = error_response(errors.Unauthenticated("no key"))
    assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
    body = json.loads(error_response(errors.Unauthenticated("no key"), openai=True).text or "{}")
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key"
    denied = error_response(errors.PermissionDenied("admins only"))
    assert denied.status == 403 and "WWW-Authenticate" not in denied.headers
    assert error_response(HttpError(403, "origin")).status == 403
    assert json.loads(error_response(HttpError(401, "x")).text or "{}")["error"]["code"] == "UNAUTHENTICATED"


def test_admin_routes_are_decided_by_service() -> None:
    levels = {(r.method, r.path): rpc_level(r.rpc) for r in ROUTES}
    assert levels[("GET", "/v1/workers")] == levels[("POST", "/v1/workers/{worker_id}/drain")] == "admin"
    assert {level for (_, path), level in levels.items() if "/workers" not in path} == {"user"}


def test_cors_origins() -> None:
    none, listed, star = Cors(()), Cors(("https://a.example/",)), Cors(("*",))
    assert not none.enabled and not none.allowed("https://a.example")
    assert listed.allowed("https://a.example") and not listed.allowed("https://b.example")
    assert listed.allow_origin("https://a.example") == "https://a.example"
    assert star.allowed("https://b.example") and star.allow_origin("https://b.example") == "*"

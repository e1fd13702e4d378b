"""The HTTP gateway as a shared service: API keys, tenants, admin routes, secure-by-default HTTP.

Real daemons: one controller with `--auth-keys` (tenants alice and bob, a quota-bound carol, an
admin) and a `null` worker; a second controller with `--cors-origin` and `--metrics-auth`; a
third over TLS. The route matrices are generated from the gateway's own router (every route the
aiohttp app registers, OpenAI routes included), so a route added later is in them untested by
no one.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx
import pytest

from omnirt.controller.edges.auth import key_digest
from omnirt.controller.http.app import HttpGateway
from omnirt.controller.http.security import rpc_level
from omnirt.controller.http.transcode import ROUTES
from tests.conftest import QUEUED_VIDEO, USER_CATALOG
from tests.daemons import Controller, Worker, wait_for

KEYS = {name: f"sk-{name}-{secrets.token_urlsafe(24)}" for name in ("alice", "bob", "carol", "root")}
WRONG_KEY = "sk-" + secrets.token_urlsafe(24)
MISSING_JOB = "job-0000000000000000"
# Probes, and what holds no data: the console's static files and the OpenAPI document.
OPEN_PATHS = {"/healthz", "/metrics", "/", "/console/{name}", "/openapi.json"}
ORIGIN = "https://app.example"
PATH_VALUES = {"index": "0", "model": "null", "worker_id": "nobody"}
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
    "referrer-policy": "no-referrer",
}
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")


def gateway_routes() -> list[tuple[str, str]]:
    """(method, path template) of every route the gateway's aiohttp app serves."""
    gateway = HttpGateway(cast(Any, None), cast(Any, None), {}, "127.0.0.1:0", 1024)
    found = set()
    for route in gateway.app.router.routes():
        resource = route.resource
        if resource is not None and route.method != "HEAD":  # HEAD: the GET handler again
            found.add((route.method, resource.canonical))
    return sorted(found)


ALL_ROUTES = gateway_routes()
GUARDED = [r for r in ALL_ROUTES if r[1] not in OPEN_PATHS]
ADMIN_ROUTES = {(r.method, r.path) for r in ROUTES if rpc_level(r.rpc) == "admin"}
JOB_ROUTES = [r for r in ALL_ROUTES if "{job_id}" in r[1] or "{video_id}" in r[1]]
BODY_ROUTES = [r for r in ALL_ROUTES if r[0] in ("POST", "PUT", "PATCH")]


def fill(template: str, job_id: str = MISSING_JOB) -> str:
    values = {**PATH_VALUES, "job_id": job_id, "video_id": job_id}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), template)


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def key_file(folder: Path) -> Path:
    roles = {"root": "admin"}
    lines = []
    for name, key in KEYS.items():
        tenant = "ops" if name == "root" else name
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'role = "{roles.get(name, "user")}"']
        lines += [f'sha256 = "{key_digest(key)}"', f'name = "{name}-key"']
        if name == "carol":
            lines.append("max_queued = 1")
    path = folder / "keys.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("security")
    catalog = folder / "user.toml"
    catalog.write_text(USER_CATALOG + QUEUED_VIDEO)
    return catalog, key_file(folder)


@pytest.fixture(scope="module")
def controller(log_dir: Path, files: tuple[Path, Path]) -> Iterator[Controller]:
    catalog, keys = files
    daemon = Controller(log_dir, "--catalog", str(catalog), "--auth-keys", str(keys), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[httpx.Client]:
    worker = Worker(log_dir, controller.address, "w-sec", model_dir, "--slots", "1").start()
    with httpx.Client(base_url=controller.http, timeout=60) as client:
        wait_for(lambda: set(workers(client)) == {"w-sec"}, 120, "the worker to connect")
        yield client
    worker.stop()


def workers(http: httpx.Client) -> dict[str, str]:
    """Worker id -> state, as an admin sees them."""
    r = http.get("/v1/workers", headers=auth("root"))
    return {w["id"]: w["state"] for w in r.json()["workers"]} if r.status_code == 200 else {}


def all_job_ids(http: httpx.Client) -> set[str]:
    r = http.get("/v1/jobs", params={"page_size": 1000}, headers=auth("root"))
    assert r.status_code == 200, r.text
    return {j["id"] for j in r.json()["jobs"]}


def submit(http: httpx.Client, who: str, model: str = "unserved-sd") -> str:
    r = http.post("/v1/jobs", json={"model": model, "prompt": f"{who}'s secret"}, headers=auth(who))
    assert r.status_code == 202, r.text
    return str(r.json()["job"]["id"])


def send(http: httpx.Client, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    return http.request(method, path, headers=headers, **body)


def assert_secure(r: httpx.Response, *, cache: bool = True) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert r.headers.get(name) == value, (r.request.url, name, dict(r.headers))
    if cache:
        assert r.headers.get("cache-control") == "no-store", (r.request.url, dict(r.headers))
    assert not any(h.lower().startswith("access-control-") for h in r.headers), dict(r.headers)


# ---- authentication: every route ---------------------------------------------------------


def test_the_matrices_cover_the_whole_router() -> None:
    # The generated lists hold what a reader expects of them (else the tests below test nothing).
    assert ("GET", "/v1/jobs/{job_id}") in GUARDED and ("POST", "/v1/images/generations") in GUARDED
    assert ("GET", "/v1/videos/{video_id}/content") in JOB_ROUTES
    assert ("GET", "/v1/workers") in ADMIN_ROUTES and (
        "POST",
        "/v1/workers/{worker_id}/drain",
    ) in ADMIN_ROUTES
    assert all((r.method, r.path) in ALL_ROUTES for r in ROUTES)


@pytest.mark.parametrize(("method", "template"), GUARDED)
@pytest.mark.parametrize("key", ["none", "wrong", "malformed"])
def test_every_route_without_a_valid_key_is_401(
    http: httpx.Client, method: str, template: str, key: str
) -> None:
    headers = {"none": {}, "wrong": {"authorization": f"Bearer {WRONG_KEY}"}}.get(
        key, {"authorization": f"Basic {KEYS['alice']}"}
    )
    r = send(http, method, fill(template), headers)
    assert r.status_code == 401, (method, template, r.text)
    assert r.headers["www-authenticate"].startswith("Bearer")
    error = r.json()["error"]
    if template.startswith(("/v1/images", "/v1/videos", "/v1/models", "/v1/audio")):  # OpenAI's shape
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    else:
        assert error["code"] == "UNAUTHENTICATED"
    assert KEYS["alice"] not in r.text and WRONG_KEY not in r.text
    assert_secure(r)


def test_probes_stay_open_without_a_key(http: httpx.Client) -> None:
    health = http.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "SERVING"
    assert_secure(health)
    metrics = http.get("/metrics")
    assert metrics.status_code == 200 and "omnirt_" in metrics.text
    assert_secure(metrics, cache=False)
    for path in ("/", "/console/app.js", "/openapi.json"):
        assert http.get(path).status_code == 200, path


@pytest.mark.parametrize(("method", "template"), GUARDED)
def test_a_user_key_reaches_every_user_route_and_no_admin_route(
    http: httpx.Client, method: str, template: str
) -> None:
    r = send(http, method, fill(template), auth("alice"))
    if (method, template) in ADMIN_ROUTES:
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "PERMISSION_DENIED"
        admin = send(http, method, fill(template), auth("root"))
        assert admin.status_code not in (401, 403), admin.text  # ListWorkers 200, drain of nobody 404
    else:
        assert r.status_code not in (401, 403), (method, template, r.text)
    assert_secure(r)


def test_admin_actions_and_refusals_are_audited_without_the_key(
    http: httpx.Client, controller: Controller
) -> None:
    time.sleep(1.1)  # the matrices' refusals filled their seconds' audit lines (20 a second)
    assert http.get("/v1/jobs", headers={"authorization": f"Bearer {WRONG_KEY}"}).status_code == 401
    assert http.post("/v1/workers/nobody/drain", headers=auth("bob")).status_code == 403
    assert http.get("/v1/workers", headers=auth("root")).status_code == 200

    def lines() -> list[dict[str, Any]]:
        found = []
        for line in controller.log().splitlines():
            if line.startswith("{") and '"event"' in line:
                found.append(json.loads(line))
        return found

    def seen(**fields: str) -> bool:
        return any(all(line.get(k) == v for k, v in fields.items()) for line in lines())

    wait_for(lambda: seen(event="auth", outcome="invalid_key", action="GET /v1/jobs"), 10, "the audit line")
    bad = next(x for x in lines() if x["outcome"] == "invalid_key" and x["action"] == "GET /v1/jobs")
    assert bad["peer"].startswith("ipv4:127.0.0.1:")
    assert seen(event="admin", outcome="denied", tenant="bob", action="DrainWorker")
    assert seen(event="admin", outcome="allowed", tenant="ops", action="ListWorkers", key="root-key")
    log = controller.log()
    assert WRONG_KEY not in log and all(key not in log for key in KEYS.values())


# ---- tenants: another tenant's job is a job that does not exist --------------------------


def not_found(r: httpx.Response, job_id: str) -> tuple[int, str]:
    """A refusal with the job's id taken out: the same for a missing job and another's."""
    return r.status_code, r.text.replace(job_id, "<id>")


@pytest.mark.parametrize(("method", "template"), JOB_ROUTES)
def test_another_tenants_job_is_404_exactly_like_a_missing_one(
    http: httpx.Client, method: str, template: str
) -> None:
    job_id = submit(http, "alice")  # stays queued: no worker serves unserved-sd
    missing = send(http, method, fill(template, MISSING_JOB), auth("bob"))
    theirs = send(http, method, fill(template, job_id), auth("bob"))
    assert missing.status_code == 404, missing.text
    assert not_found(theirs, job_id) == not_found(missing, MISSING_JOB)
    assert_secure(theirs)
    # Nothing happened to alice's job (bob's DELETE cancelled nothing); she still reaches it.
    mine = http.get(f"/v1/jobs/{job_id}", headers=auth("alice")).json()["job"]
    assert mine["state"] == "JOB_STATE_QUEUED"
    http.delete(f"/v1/jobs/{job_id}", headers=auth("alice"))


def test_lists_show_the_callers_jobs_and_an_admin_sees_all(http: httpx.Client) -> None:
    alices, bobs = submit(http, "alice"), submit(http, "bob")
    try:

        def listed(who: str, path: str = "/v1/jobs") -> set[str]:
            r = http.get(path, headers=auth(who))
            assert r.status_code == 200, r.text
            return {j["id"] for j in r.json()["jobs" if path == "/v1/jobs" else "data"]}

        assert alices in listed("alice") and bobs not in listed("alice")
        assert bobs in listed("bob") and alices not in listed("bob")
        assert {alices, bobs} <= listed("root")
        video = http.post("/v1/videos", json={"model": "queued-video", "prompt": "x"}, headers=auth("alice"))
        assert video.status_code == 200, video.text
        assert video.json()["id"] in listed("alice", "/v1/videos")
        assert video.json()["id"] not in listed("bob", "/v1/videos")
        http.delete(f"/v1/videos/{video.json()['id']}", headers=auth("alice"))
    finally:
        http.delete(f"/v1/jobs/{alices}", headers=auth("alice"))
        http.delete(f"/v1/jobs/{bobs}", headers=auth("bob"))


def test_artifact_urls_and_streams_are_the_owners_alone(http: httpx.Client, controller: Controller) -> None:
    r = http.post(
        "/v1/generate",
        json={"model": "null", "prompt": "mine", "output": {"inline_limit_bytes": 1}},
        headers=auth("alice"),
    )
    assert r.status_code == 200, r.text
    job_id, uri = r.json()["job"]["id"], r.json()["result"]["artifacts"][0]["uri"]
    assert http.get(uri, headers=auth("alice")).headers["content-type"] == "image/png"
    assert not_found(http.get(uri, headers=auth("bob")), job_id) == not_found(
        http.get(uri.replace(job_id, MISSING_JOB), headers=auth("bob")), MISSING_JOB
    )
    images = http.post(
        "/v1/images/generations",
        json={"model": "null", "prompt": "mine", "response_format": "url"},
        headers=auth("alice"),
    )
    assert images.status_code == 200, images.text
    url = images.json()["data"][0]["url"]
    assert http.get(url, headers=auth("alice")).status_code == 200
    assert http.get(url, headers=auth("bob")).status_code == 404
    b64 = http.post("/v1/images/generations", json={"model": "null", "prompt": "x"}, headers=auth("bob"))
    assert b64.status_code == 200 and b64.json()["data"][0]["b64_json"]
    events = http.get(f"/v1/jobs/{job_id}/events", headers=auth("alice"))
    assert events.status_code == 200 and "event: state" in events.text

    async def websocket(who: str, job: str) -> int:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"{controller.http}/v1/jobs/{job}/stream", headers=auth(who)):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(websocket("alice", job_id)) == 101
    assert asyncio.run(websocket("bob", job_id)) == 404 == asyncio.run(websocket("bob", MISSING_JOB))


def test_a_tenants_quota_is_429_with_retry_after(http: httpx.Client) -> None:
    first = submit(http, "carol")
    try:
        r = http.post("/v1/jobs", json={"model": "unserved-sd", "prompt": "more"}, headers=auth("carol"))
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
        assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
        oai = http.post("/v1/videos", json={"model": "queued-video", "prompt": "x"}, headers=auth("carol"))
        assert oai.status_code == 429 and oai.json()["error"]["type"] == "rate_limit_error"
        assert int(oai.headers["retry-after"]) >= 1
        assert submit(http, "alice")  # carol's quota is hers alone
    finally:
        http.delete(f"/v1/jobs/{first}", headers=auth("carol"))


# ---- bodies: only JSON and multipart -----------------------------------------------------


@pytest.mark.parametrize(("method", "template"), BODY_ROUTES)
@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"model=null&prompt=forged"),
        ("text/plain", b'{"model": "null", "prompt": "forged"}'),
        ("text/plain", b""),  # a <form enctype="text/plain"> with no fields
    ],
)
def test_a_form_post_is_415_and_makes_nothing(
    http: httpx.Client, method: str, template: str, content_type: str, body: bytes
) -> None:
    before, serving = all_job_ids(http), workers(http)
    path = fill(template).replace("/nobody/", "/w-sec/")  # a drain would drain the real worker
    r = http.request(method, path, content=body, headers={**auth("root"), "content-type": content_type})
    assert r.status_code == 415, r.text
    assert "application/json or multipart/form-data" in r.text
    assert_secure(r)
    assert all_job_ids(http) == before and workers(http) == serving


def test_json_with_a_charset_and_bodiless_posts_are_taken(http: httpx.Client) -> None:
    body = json.dumps({"model": "null", "prompt": "x"}).encode()
    typed = {**auth("alice"), "content-type": "application/json; charset=utf-8"}
    assert http.post("/v1/validate", content=body, headers=typed).status_code == 200
    # curl -X POST: no body, no Content-Type; the drain of an unknown worker is its 404.
    assert http.post("/v1/workers/nobody/drain", headers=auth("root")).status_code == 404


# ---- CORS, Origin and headers ------------------------------------------------------------


def test_no_cors_by_default_and_a_foreign_origin_is_refused(
    http: httpx.Client, controller: Controller
) -> None:
    before = all_job_ids(http)
    headers = {**auth("alice"), "origin": "https://evil.example"}
    r = http.post("/v1/generate", json={"model": "null", "prompt": "x"}, headers=headers)
    assert r.status_code == 403 and r.json()["error"]["field"] == "Origin", r.text
    assert_secure(r)
    preflight = http.options(
        "/v1/generate", headers={"origin": ORIGIN, "access-control-request-method": "POST"}
    )
    assert preflight.status_code >= 400
    assert_secure(preflight)
    assert all_job_ids(http) == before
    # Our own origin (a page this gateway would serve) and clients that send none are fine.
    own = {**auth("alice"), "origin": controller.http}
    assert http.get("/v1/jobs", headers=own).status_code == 200

    async def websocket(origin: str) -> int:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(
                    f"{controller.http}/v1/jobs/{MISSING_JOB}/stream", headers=auth("alice"), origin=origin
                ):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(websocket("https://evil.example")) == 403  # cross-site WebSocket hijacking
    assert asyncio.run(websocket(controller.http)) == 404


@pytest.fixture(scope="module")
def cors(log_dir: Path, files: tuple[Path, Path]) -> Iterator[httpx.Client]:
    catalog, keys = files
    daemon = Controller(
        log_dir, "--catalog", str(catalog), "--auth-keys", str(keys), "--cors-origin", ORIGIN,
        "--metrics-auth", http=True,
    ).start()  # fmt: skip
    with httpx.Client(base_url=daemon.http, timeout=30) as client:
        yield client
    daemon.stop()


def test_cors_origins_get_preflights_and_readable_answers(cors: httpx.Client) -> None:
    preflight = cors.options(
        "/v1/jobs",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed = preflight.headers["access-control-allow-headers"]
    assert "authorization" in allowed and "content-type" in allowed
    assert int(preflight.headers["access-control-max-age"]) > 0
    assert "Origin" in preflight.headers["vary"]
    assert "access-control-allow-credentials" not in preflight.headers
    r = cors.get("/v1/jobs", headers={**auth("alice"), "origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "Origin" in r.headers["vary"]
    refused = cors.get("/v1/jobs", headers={**auth("alice"), "origin": "https://evil.example"})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    evil = cors.options(
        "/v1/jobs", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
    )
    assert evil.status_code >= 400 and "access-control-allow-origin" not in evil.headers


def test_metrics_auth_puts_metrics_behind_an_admin_key(cors: httpx.Client) -> None:
    assert cors.get("/metrics").status_code == 401
    assert cors.get("/metrics", headers=auth("alice")).status_code == 403
    r = cors.get("/metrics", headers=auth("root"))
    assert r.status_code == 200 and "omnirt_" in r.text
    assert cors.get("/healthz").status_code == 200


def test_sse_and_downloads_carry_the_security_headers(http: httpx.Client) -> None:
    r = http.post(
        "/v1/generate",
        json={"model": "null", "prompt": "h", "output": {"inline_limit_bytes": 1}},
        headers=auth("alice"),
    )
    job_id = r.json()["job"]["id"]
    for path in (f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/artifacts/0"):
        streamed = http.get(path, headers=auth("alice"))
        assert streamed.status_code == 200, streamed.text
        assert_secure(streamed)
        assert "strict-transport-security" not in streamed.headers  # plain HTTP: no HSTS


def test_over_tls_every_answer_has_hsts(log_dir: Path, files: tuple[Path, Path], tmp_path: Path) -> None:
    from tests.certs import make_ca, make_cert

    catalog, keys = files
    ca = make_ca(tmp_path)
    server = make_cert(ca, tmp_path, "controller")
    daemon = Controller(
        log_dir, "--catalog", str(catalog), "--auth-keys", str(keys),
        "--tls-cert", server.cert, "--tls-key", server.key,
        http=True, tls_ca=ca.cert, api_key=KEYS["root"],
    ).start()  # fmt: skip
    try:
        context = ssl.create_default_context(cafile=ca.cert)
        with httpx.Client(base_url=daemon.http, verify=context, timeout=30) as client:
            for r in (
                client.get("/healthz"),
                client.get("/v1/jobs"),
                client.get("/v1/jobs", headers=auth("bob")),
            ):
                assert r.headers["strict-transport-security"] == "max-age=31536000", dict(r.headers)
                assert_secure(r)
        with pytest.raises(httpx.TransportError):  # plaintext against TLS
            httpx.get(daemon.http.replace("https://", "http://") + "/healthz", timeout=5)
    finally:
        daemon.stop()


def test_a_loopback_gateway_without_keys_answers_only_to_addresses_and_localhost(log_dir: Path) -> None:
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 is same-origin
    to its browser, so Origin does not tell; the Host it sends does."""
    daemon = Controller(log_dir, http=True).start()
    try:
        port = daemon.http.rsplit(":", 1)[1]
        for host, status in (
            (f"127.0.0.1:{port}", 200),
            (f"localhost:{port}", 200),
            (f"[::1]:{port}", 200),
            (f"evil.example:{port}", 403),
            ("evil.example", 403),
        ):
            r = httpx.get(f"{daemon.http}/v1/jobs", headers={"Host": host}, timeout=10)
            assert r.status_code == status, (host, r.status_code, r.text)
        r = httpx.post(
            f"{daemon.http}/v1/jobs",
            json={"request": {"model": "null", "prompt": "x"}},
            headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
            timeout=10,
        )
        assert r.status_code == 403 and "DNS rebinding" in r.json()["error"]["message"], r.text
        assert httpx.get(f"{daemon.http}/v1/jobs", timeout=10).json()["jobs"] == [], "no job was made"
    finally:
        daemon.stop()

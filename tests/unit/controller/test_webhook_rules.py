"""Webhook rules without daemons: which URLs and addresses are refused, the signature, the body."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import parse_webhook_url, validate
from omnirt.controller.http.transcode import job_json
from omnirt.controller.webhooks import payload
from omnirt.controller.webhooks.addresses import AddressPolicy, refused_kind
from omnirt.controller.webhooks.signing import Signer
from omnirt.errors import InvalidRequest
from omnirt.types import (
    Artifact,
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobEvent,
    JobState,
    MediaKind,
    Webhook,
    WebhookEvent,
)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.0.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "private"),  # reserved; Python counts 240/4 as private too
        ("100.64.0.1", "non-global"),
        ("93.184.216.34", ""),
        ("2606:4700::1111", ""),
    ],
)
def test_refused_kinds(address: str, kind: str) -> None:
    assert refused_kind(ipaddress.ip_address(address)) == kind


def test_allow_list_admits_ranges_and_hosts_only() -> None:
    policy = AddressPolicy.parse(("127.0.0.1/32", "10.0.0.0/8", "Hooks.Internal."))
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) == ""
    assert policy.refusal(ipaddress.ip_address("::ffff:10.9.9.9")) == ""
    assert policy.refusal(ipaddress.ip_address("127.0.0.2")) == "loopback"
    assert policy.refusal(ipaddress.ip_address("192.168.1.1")) == "private"
    assert policy.host_allowed("hooks.internal") and not policy.host_allowed("other.internal")
    with pytest.raises(ValueError, match="webhook-allow"):
        AddressPolicy.parse(("10.0.0.0/33",))


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://example.com/x",
        "file:///etc/passwd",
        "gopher://example.com",
        "http:///nohost",
        "http://user:pw@example.com/",
        "http://example.com:99999/",
        "http://exa mple.com/",
        "http://example.com/" + "a" * 2100,
        "http://ex\u00e4mple.com/",
    ],
)
def test_bad_urls_name_webhook_url(url: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_webhook_url(url)
    assert caught.value.field == "webhook.url"


def test_a_name_that_resolves_to_loopback_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="loopback") as caught:
        asyncio.run(AddressPolicy().check("http://localhost:8080/hook"))
    assert caught.value.field == "webhook.url"
    asyncio.run(AddressPolicy.parse(("127.0.0.0/8", "::1/128")).check("http://localhost:8080/hook"))


def test_validation_checks_the_interval_and_normalizes_the_webhook() -> None:
    catalog = Catalog.load(())
    hook = Webhook("https://hooks.example.com/x", [WebhookEvent.COMPLETED, WebhookEvent.COMPLETED])
    plan = validate(GenerateRequest(model="null", prompt="x", webhook=hook), catalog)
    assert plan.request.webhook == Webhook("https://hooks.example.com/x", [WebhookEvent.COMPLETED], 1000)
    for interval in (-1, 5, 3_600_001):
        bad = Webhook("https://hooks.example.com/x", progress_interval_ms=interval)
        with pytest.raises(InvalidRequest) as caught:
            validate(GenerateRequest(model="null", prompt="x", webhook=bad), catalog)
        assert caught.value.field == "webhook.progress_interval_ms"
    with pytest.raises(InvalidRequest) as caught:
        validate(GenerateRequest(model="null", prompt="x", webhook=Webhook("ftp://x/")), catalog)
    assert caught.value.field == "webhook.url"


def test_signature_verifies_with_the_spec_library_and_secrets_differ_by_tenant() -> None:
    signer = Signer(b"0123456789abcdef0123")
    body = b'{"type":"job.completed"}'
    headers = signer.headers("alice", "msg_job-1_7", int(datetime.now(UTC).timestamp()), body)
    assert Verifier(signer.secret("alice")).verify(body, headers) == {"type": "job.completed"}
    assert signer.secret("alice") != signer.secret("bob")
    assert Signer(b"0123456789abcdef0123").secret("alice") == signer.secret("alice")
    assert signer.secret("alice") != Signer(b"another-master-secret").secret("alice")


def test_body_links_artifacts_and_never_inlines_bytes() -> None:
    artifact = Artifact(index=0, kind=MediaKind.IMAGE, mime_type="image/png", data=b"\x89PNG" * 100)
    job = Job(
        id="job-1",
        state=JobState.SUCCEEDED,
        model="null",
        result=GenerateResult(job_id="job-1", artifacts=[artifact]),
    )
    event = JobEvent(job_id="job-1", kind=EventKind.STATE, sequence=5, state=JobState.SUCCEEDED)
    event.time = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    kind = payload.webhook_event(event)
    assert kind is WebhookEvent.COMPLETED
    data = json.loads(payload.body(kind, event, job, "http://gw:8080", job_json))
    assert data["type"] == "job.completed" and data["sequence"] == 5
    assert data["timestamp"] == "2026-01-02T03:04:05Z"
    out = data["data"]["result"]["artifacts"][0]
    assert out["uri"] == "http://gw:8080/v1/jobs/job-1/artifacts/0" and not out.get("data")
    assert payload.message_id("job-1", 5) == "msg_job-1_5"
    assert payload.webhook_event(JobEvent(job_id="j", kind=EventKind.LOG)) is None

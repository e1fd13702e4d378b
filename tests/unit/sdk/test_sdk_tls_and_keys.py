"""The SDK's API key and TLS arguments: the key goes with every call (plaintext loopback too,
the raw stubs included) and never into repr or errors; unusable TLS arguments fail at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sdk_fake_server import FakeController, success_events

from omnirt import AsyncClient, Client, errors
from omnirt.v1 import models_pb2
from tests.certs import make_ca, make_cert

KEY = "sk-" + "x" * 40


def test_the_key_goes_with_unary_calls_streams_and_raw_stubs(fake: FakeController) -> None:
    fake.events["job-1"] = success_events("job-1")
    with Client(fake.address, api_key=KEY, metadata=[("x-team", "a")]) as client:
        client.list_models()
        list(client.watch("job-1"))
        client.models.ListModels(models_pb2.ListModelsRequest(), timeout=5)
    assert [m.get("authorization") for m in fake.metadata] == [f"Bearer {KEY}"] * 3
    assert [m.get("x-team") for m in fake.metadata[:2]] == ["a", "a"], "the caller's metadata stays"


def test_the_async_client_sends_the_key_too(fake: FakeController) -> None:
    fake.events["job-1"] = success_events("job-1")

    async def run() -> None:
        async with AsyncClient(fake.address, api_key=KEY) as client:
            await client.list_models()
            assert [e.sequence async for e in client.watch("job-1")]
            await client.models.ListModels(models_pb2.ListModelsRequest(), timeout=5)

    asyncio.run(run())
    assert [m.get("authorization") for m in fake.metadata] == [f"Bearer {KEY}"] * 3


def test_the_key_comes_from_the_environment_unless_turned_off(
    fake: FakeController, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNIRT_API_KEY", KEY)
    with Client(fake.address) as client:
        client.list_models()
    with Client(fake.address, api_key="") as client:
        client.list_models()
    assert [m.get("authorization") for m in fake.metadata] == [f"Bearer {KEY}", None]


def test_the_key_is_in_no_repr_and_no_error(fake: FakeController) -> None:
    fake.fail["ListModels"] = errors.Unauthenticated("the API key is not valid")
    with Client(fake.address, api_key=KEY) as client:
        assert KEY not in repr(client) and KEY not in repr(client.channel)
        with pytest.raises(errors.Unauthenticated) as refused:
            client.list_models()
    assert KEY not in str(refused.value) and KEY not in repr(refused.value)
    with pytest.raises(ValueError, match="printable ASCII") as bad:
        Client(fake.address, api_key="line\nbreak-" + KEY)
    assert KEY not in str(bad.value)


def test_tls_arguments_that_cannot_work_fail_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMNIRT_TLS_CA", raising=False)
    ca = make_ca(tmp_path)
    mine, other = make_cert(ca, tmp_path, "me", client=True), make_cert(ca, tmp_path, "other", client=True)
    with pytest.raises(ValueError, match="cert= and key= go together"):
        Client("127.0.0.1:1", cert=mine.cert)
    with pytest.raises(ValueError, match="need TLS"):
        Client("127.0.0.1:1", tls=False, ca=ca.cert)
    with pytest.raises(ValueError, match=f"ca: {mine.key}: not a PEM certificate bundle"):
        Client("127.0.0.1:1", ca=mine.key)
    with pytest.raises(ValueError, match="the key does not match the certificate"):
        Client("127.0.0.1:1", ca=ca.cert, cert=mine.cert, key=other.key)
    with pytest.raises(FileNotFoundError):
        Client("127.0.0.1:1", ca=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="not both"):
        AsyncClient("127.0.0.1:1", credentials=object(), ca=ca.cert)  # type: ignore[arg-type]


def test_a_ca_in_the_environment_means_tls_unless_tls_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = make_ca(tmp_path)
    monkeypatch.setenv("OMNIRT_TLS_CA", ca.cert)
    with Client("127.0.0.1:1") as from_env, Client("127.0.0.1:1", tls=False) as plain:
        assert from_env.tls and not plain.tls
        assert repr(from_env) == "Client('127.0.0.1:1', tls=True)"


@pytest.mark.parametrize(
    ("given", "dialled"),
    [
        ("127.0.0.1", "127.0.0.1:50051"),
        ("controller.example", "controller.example:50051"),
        ("::1", "[::1]:50051"),
        ("[::1]", "[::1]:50051"),
        ("127.0.0.1:7000", "127.0.0.1:7000"),
        ("[::1]:7000", "[::1]:7000"),
        ("unix:/run/omnirt.sock", "unix:/run/omnirt.sock"),
        ("dns:///controller.example:443", "dns:///controller.example:443"),
    ],
)
def test_an_address_without_a_port_dials_the_controllers_port(given: str, dialled: str) -> None:
    with Client(given) as client:  # gRPC's own default would be 443
        assert client.address == dialled

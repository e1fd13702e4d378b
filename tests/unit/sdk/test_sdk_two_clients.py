"""`Client` and `AsyncClient` are one client in two flavours: the same public methods, the same
parameters, and the same answers to the same calls (both run the plans of
`omnirt._internal.calls`; only the I/O differs)."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from sdk_fake_server import FakeController, job, sample_result, success_events

from omnirt import AsyncClient, Client
from omnirt.types import JobState


def _public(cls: type) -> dict[str, Any]:
    return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def _parameters(function: Any) -> list[str]:
    # Names, kinds, defaults and annotations; the return annotation differs by flavour
    # (Iterator / AsyncIterator, RealtimeSession / AsyncRealtimeSession).
    return [str(p) for p in inspect.signature(function).parameters.values()]


def test_the_two_clients_have_the_same_methods_and_parameters() -> None:
    sync, aio = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(aio)
    for name in ["__init__", *sync]:
        assert _parameters(getattr(Client, name)) == _parameters(getattr(AsyncClient, name)), name
    for name, method in aio.items():
        if name == "watch":  # an async iterator, as Client.watch is an iterator
            assert not inspect.iscoroutinefunction(method)
        else:
            assert inspect.iscoroutinefunction(method), f"AsyncClient.{name} is not awaited"
            assert not inspect.iscoroutinefunction(sync[name])


# One call of every public method (open_session needs a realtime server: tests/integration).
CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("generate", (), {"model": "tiny-sd", "prompt": "a fox", "seed": 7}),
    ("submit", (), {"model": "tiny-sd", "prompt": "a fox", "idempotency_key": "k"}),
    ("validate", (), {"model": "tiny-sd", "prompt": "x", "width": 128}),
    ("get_job", ("j",), {}),
    ("list_jobs", (), {"states": ["succeeded"], "limit": 1}),
    ("watch", ("j",), {"after_sequence": 3}),
    ("cancel", ("j",), {}),
    ("wait", ("j",), {"timeout": 10}),
    ("download_artifact", ("j", 0), {}),
    ("save", (sample_result("j", inline=False),), {}),
    ("list_models", ("text2image",), {}),
    ("describe_model", ("tiny-stable-diffusion",), {}),
    ("load_model", ("tiny-sd",), {"workers": 1}),
    ("unload_model", ("tiny-sd",), {"worker_ids": ["w-1"]}),
    ("list_workers", (), {}),
    ("list_sessions", ("tiny-talking-head",), {}),
    ("drain_worker", ("w-1",), {}),
    ("webhook_secret", ("acme",), {}),
    ("close", (), {}),
]


def _script(fake: FakeController) -> None:
    fake.jobs["j"] = job("j", JobState.SUCCEEDED)
    fake.events["j"] = success_events("j")
    fake.downloads[("j", 0)] = b"0123456789abcdef"


def _paths(answer: Any, folder: Path) -> Any:
    # `save` writes under the folder it was given: compare what it wrote, not where.
    return [(p.relative_to(folder), p.read_bytes()) for p in answer] if isinstance(answer, list) else answer


def test_every_method_is_in_the_table() -> None:
    tabled = sorted([*(name for name, _, _ in CALLS), "open_session"])
    assert tabled == sorted(_public(Client)) == sorted(_public(AsyncClient))


@pytest.mark.parametrize(("name", "args", "kwargs"), CALLS, ids=[c[0] for c in CALLS])
def test_both_clients_answer_a_call_alike(
    fake: FakeController, tmp_path: Path, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    if name == "save":
        kwargs = {"folder": tmp_path / "sync"}
    _script(fake)
    with Client(fake.address, timeout=10) as client:
        answer = getattr(client, name)(*args, **kwargs)
        if name == "watch":
            answer = list(answer)
    sent = list(fake.requests)
    if name == "save":
        answer = _paths(answer, tmp_path / "sync")
        kwargs = {"folder": tmp_path / "aio"}

    async def awaited() -> Any:
        async with AsyncClient(fake.address, timeout=10) as client:
            if name == "watch":
                return [e async for e in client.watch(*args, **kwargs)]
            return await getattr(client, name)(*args, **kwargs)

    fake.requests.clear()
    _script(fake)
    awaited_answer = asyncio.run(awaited())
    if name == "save":
        awaited_answer = _paths(awaited_answer, tmp_path / "aio")
    assert awaited_answer == answer
    assert fake.requests == sent  # the same request went out
    if name not in ("close", "save"):
        assert answer not in (None, [], b""), "the call should answer something to compare"

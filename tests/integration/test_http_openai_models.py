"""The official `openai` client lists and retrieves models through a real controller's gateway.

`GET /v1/models` answers OpenAI's shape (`client.models.list().data`), `GET /v1/models/{id}` one
model object, an unknown id OpenAI's 404; OmniRT's full listing is `/v1/omnirt/models`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.daemons import Controller


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def oai(controller: Controller) -> openai.OpenAI:
    return openai.OpenAI(base_url=controller.http + "/v1", api_key="x", max_retries=0, timeout=30)


def test_the_openai_client_lists_the_catalog(oai: openai.OpenAI) -> None:
    models = oai.models.list()
    by_id = {m.id: m for m in models.data}
    assert {"tiny-sd", "null", "unserved-sd", "broken-sd"} <= set(by_id)
    assert {(m.object, m.owned_by) for m in models.data} == {("model", "omnirt")}
    created = {m.created for m in models.data}
    assert len(created) == 1 and isinstance(created.pop(), int)
    assert [m.model_dump() for m in oai.models.list().data] == [m.model_dump() for m in models.data]


def test_the_openai_client_retrieves_one_model(oai: openai.OpenAI) -> None:
    model = oai.models.retrieve("tiny-sd")
    assert (model.id, model.object, model.owned_by) == ("tiny-sd", "model", "omnirt")
    assert model.created == next(m.created for m in oai.models.list().data if m.id == "tiny-sd")
    assert oai.models.retrieve("tiny-stable-diffusion").id == "tiny-sd", "an alias answers the model's id"
    with pytest.raises(openai.NotFoundError) as missing:
        oai.models.retrieve("dall-e-3")
    assert missing.value.code == "model_not_found"
    assert set(missing.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]


def test_the_full_model_specs_stay_at_their_own_route(controller: Controller) -> None:
    with httpx.Client(base_url=controller.http) as http:
        models = {m["id"]: m for m in http.get("/v1/omnirt/models").json()["models"]}
        assert models["tiny-sd"]["tasks"] and "defaults" in models["tiny-sd"]
        described = http.get("/v1/omnirt/models/tiny-stable-diffusion").json()["model"]
        assert described["id"] == "tiny-sd"
        assert http.get("/v1/omnirt/models/tiny-sdd").status_code == 404

"""The original OmniRT's model ids through a real controller: `omnirtctl models list --original`,
the gRPC API and the HTTP gateway. No worker: every answer here comes from the catalog."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omnirt import errors
from tests.daemons import Controller
from tests.e2e.test_cli import omnirtctl

FLASHTALK = (
    "model 'soulx-flashtalk-14b' is an id of the original OmniRT that this build does not serve: "
    "a talking head that runs in its own resident runtime, SoulX-FlashTalk's checkout; "
    "the closest here is 'tiny-talking-head' (see docs/migrating.md)"
)


@pytest.fixture(scope="module")
def gateway(log_dir: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, http=True).start()
    yield daemon
    daemon.stop()


def http(
    controller: Controller, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        controller.http + path, data=data, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_models_list_original_shows_the_original_ids_beside_ours(gateway: Controller) -> None:
    lines = omnirtctl(gateway, "models", "list", "--original").stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "ORIGINAL", "FAMILY"]
    rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
    assert rows["sdxl"] == "sdxl-base-1.0"
    assert rows["sd2.1"] == "sd21" and rows["wan2.2-t2v-a14b"] == "wan2.2-t2v-14b"
    assert rows["tiny-sd"] == "-"
    # With --json, each model's `original_ids` (its own id counts: qwen-image is the original's).
    listed = omnirtctl(gateway, "models", "list", "--original", "--json").stdout
    models = {m["id"]: m for m in json.loads(listed)}
    assert models["flux.2-dev"]["original_ids"] == ["flux2-dev", "flux2.dev"]
    assert models["qwen-image"]["original_ids"] == ["qwen-image"]
    assert models["tiny-sd"]["original_ids"] == []


def test_an_id_not_served_is_not_found_on_every_surface(gateway: Controller) -> None:
    proc = omnirtctl(gateway, "generate", "--model", "soulx-flashtalk-14b", "--prompt", "hi", check=False)
    assert (proc.returncode, proc.stderr) == (1, f"error: NOT_FOUND: {FLASHTALK}\n")
    with gateway.client() as client:
        with pytest.raises(errors.ModelNotFound) as info:
            client.validate(model="soulx-flashtalk-14b", prompt="hi")
        assert str(info.value).startswith(FLASHTALK) and info.value.field == "model"
        assert client.describe_model("sdxl-base-1.0").id == "sdxl"
    status, body = http(gateway, "POST", "/v1/validate", {"model": "soulx-flashtalk-14b", "prompt": "hi"})
    assert (status, body["error"]["code"], body["error"]["field"]) == (404, "NOT_FOUND", "model")
    assert body["error"]["message"].startswith(FLASHTALK)
    status, body = http(gateway, "POST", "/v1/validate", {"model": "sdxl-base-1.0", "prompt": "hi"})
    assert (status, body["model"]) == (200, "sdxl")
    status, body = http(gateway, "GET", "/v1/models/hunyuan-video")  # OpenAI's: the model's own id
    assert (status, body["id"]) == (200, "hunyuanvideo")

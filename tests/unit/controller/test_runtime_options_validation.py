"""Runtime options per request (`extra.runtime`): validated by the controller, part of the batching key."""

from __future__ import annotations

import dataclasses

import pytest

from omnirt._internal import runtime_schema
from omnirt.controller.core.batching import batch_key
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import validate
from omnirt.errors import InvalidRequest
from omnirt.types import GenerateRequest


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def req(runtime: object, model: str = "tiny-sd") -> GenerateRequest:
    return GenerateRequest(model=model, prompt="a red fox", seed=1, extra={"runtime": runtime})


def test_options_are_normalized_into_the_resolved_request(catalog: Catalog) -> None:
    plan = validate(
        req(
            {"torch_compile": True, "step_cache": "first_block", "quantization": "int8_weight_only"},
            "tiny-wan",
        ),
        catalog,
    )
    assert plan.request.extra["runtime"] == {
        "torch_compile": "inductor",
        "step_cache": {"kind": "first_block"},
        "quantization": {"backend": "torchao", "method": "int8_weight_only"},
    }
    assert plan.config["extra"]["runtime"] == plan.request.extra["runtime"]  # what Validate shows


@pytest.mark.parametrize(
    ("runtime", "field", "words"),
    [
        ({"vae_tiling": True}, "extra.runtime.vae_tiling", "unknown runtime option"),
        ({"enable_vae_tiling": "yes"}, "extra.runtime.enable_vae_tiling", "true or false"),
        ({"inference_mode": "off"}, "extra.runtime.inference_mode", "true or false"),
        ({"cpu_offload": "sometimes"}, "extra.runtime.cpu_offload", "'model' or 'sequential'"),
        ({"layerwise_casting": "int3"}, "extra.runtime.layerwise_casting", "storage dtype"),
        (
            {"quantization": {"backend": "bitsandbytes", "method": "int8_weight_only"}},
            "extra.runtime.quantization.backend",
            "torchao",
        ),
        ({"quantization": "int3_weight_only"}, "extra.runtime.quantization.method", "torchao method"),
        ({"step_cache": {"kind": "teacache"}}, "extra.runtime.step_cache.kind", "first_block"),
        (
            {"step_cache": {"kind": "first_block", "threshold": "high"}},
            "extra.runtime.step_cache.threshold",
            "number",
        ),
        (
            {"step_cache": {"kind": "first_block", "alpha": 1}},
            "extra.runtime.step_cache.alpha",
            "unknown setting",
        ),
        (
            {
                "step_cache": {
                    "kind": "pyramid_attention_broadcast",
                    "spatial_attention_timestep_skip_range": [9, 1],
                }
            },
            "extra.runtime.step_cache.spatial_attention_timestep_skip_range",
            "low must not exceed high",
        ),
        ("tiling", "extra.runtime", "must be an object"),
    ],
)
def test_bad_options_are_invalid_argument_naming_the_field(
    catalog: Catalog, runtime: object, field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate(req(runtime, "tiny-wan"), catalog)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_only_legacy_call_models_take_runtime_options(catalog: Catalog) -> None:
    with pytest.raises(InvalidRequest, match="modular mode") as caught:
        validate(req({"enable_vae_tiling": True}, "tiny-sd-modular"), catalog)
    assert caught.value.field == "extra.runtime"


def test_a_catalog_entry_can_restrict_what_requests_set(catalog: Catalog) -> None:
    spec = dataclasses.replace(
        catalog.resolve("tiny-sd"), runtime={runtime_schema.REQUEST_OPTIONS_KEY: ["enable_vae_tiling"]}
    )
    restricted = Catalog([spec])
    assert validate(req({"enable_vae_tiling": True}), restricted).request.extra["runtime"]
    with pytest.raises(InvalidRequest, match=r"allowed: enable_vae_tiling") as caught:
        validate(req({"torch_compile": "eager"}), restricted)
    assert caught.value.field == "extra.runtime.torch_compile"


def test_different_runtime_options_never_share_a_batch(catalog: Catalog) -> None:
    def key(runtime: object | None) -> object:
        request = GenerateRequest(model="tiny-wan", prompt="a boat", seed=1)
        if runtime is not None:
            request.extra = {"runtime": runtime}
        return batch_key(validate(request, catalog), max_batch_size=4)

    plain = key(None)
    cached = key({"step_cache": {"kind": "first_block", "threshold": 0.2}})
    assert plain is not None and cached is not None
    assert plain != cached
    assert cached != key({"step_cache": {"kind": "first_block", "threshold": 0.1}})
    # Spelled differently, meaning the same: normalized, so they may share a call.
    assert key({"torch_compile": True}) == key({"torch_compile": "inductor"})

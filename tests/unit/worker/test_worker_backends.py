"""Backend choice and placement options (fakes answer for a CUDA / NPU this machine lacks)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from omnirt.worker.runtime import backends
from omnirt.worker.runtime.backends import BackendError, Placement


@pytest.fixture
def no_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ImportError


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: True), raising=False)


def test_auto_prefers_cuda_then_ascend_then_cpu(monkeypatch: pytest.MonkeyPatch, fake_npu: None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backends.detect_backend("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backends.detect_backend("auto") == "ascend"


def test_auto_without_accelerators_is_cpu(monkeypatch: pytest.MonkeyPatch, no_npu: None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backends.detect_backend("auto") == "cpu"


def test_ascend_without_torch_npu_says_how_to_install(no_npu: None) -> None:
    with pytest.raises(BackendError, match=r"torch_npu.*omnirt\[ascend\]"):
        backends.detect_backend("ascend")


def test_torch_npu_is_imported_only_for_ascend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backends.detect_backend("cuda")
    backends.detect_backend("cpu")
    backends.detect_backend("auto")  # cuda found first: no NPU probe
    assert "torch_npu" not in sys.modules


def test_dtypes_per_backend() -> None:
    assert backends.placement_for("cpu").dtype == "float32"
    assert backends.placement_for("cpu", {"dtype": "bf16"}).dtype == "float32"  # CPU stays float32
    assert backends.placement_for("cuda").dtype == "float16"
    assert backends.placement_for("ascend", {"dtype": "bfloat16"}).dtype == "bfloat16"


def test_a_dtype_table_picks_the_backends_own() -> None:
    """The family table's `dtype = {cuda = "bfloat16", ascend = "float16"}` form."""
    table = {"dtype": {"cuda": "bfloat16", "ascend": "float16"}}
    assert backends.placement_for("cuda", table).dtype == "bfloat16"
    assert backends.placement_for("ascend", table).dtype == "float16"
    assert backends.placement_for("cpu", table).dtype == "float32"
    assert backends.placement_for("cuda", {"dtype": {"ascend": "bfloat16"}}).dtype == "float16"


def test_devices_and_device_map() -> None:
    assert backends.placement_for("cuda", {"devices": [1]}) == Placement("cuda", "cuda:1", "float16")
    several = backends.placement_for("cuda", {"devices": ["cuda:0", 2]})
    assert several.device_map == "balanced" and several.devices == ("cuda:0", "cuda:2")
    assert several.device == "cuda:0"
    npu = backends.placement_for("ascend", {"devices": ["npu:3"], "device_map": "balanced"})
    assert (npu.device, npu.device_map, npu.devices) == ("npu:3", "balanced", ("npu:3",))
    assert backends.placement_for("cpu", {"devices": ["cpu"], "device_map": "cpu"}) == Placement(
        "cpu", "cpu", "float32"
    )


def test_the_worker_device_names_every_device_of_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Hello and `ListWorkers` say the worker runs on."""
    assert backends.worker_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert backends.worker_device("cuda") == "cuda:0,1"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert backends.worker_device("cuda") == "cuda:0"
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(device_count=lambda: 0), raising=False)
    assert backends.worker_device("ascend") == "npu"


@pytest.mark.parametrize(
    ("backend", "runtime", "match"),
    [
        ("cpu", {"devices": [0]}, "only 'cpu'"),
        ("cpu", {"device_map": "balanced"}, "only 'cpu'"),
        ("cuda", {"devices": ["npu:0"]}, "not a cuda device"),
        ("cuda", {"devices": [0, "cuda:0"]}, "twice"),
        ("cuda", {"device_map": "sequential-ish"}, "not supported"),
        ("cuda", {"devices": {"a": 1}}, "list of device"),
    ],
)
def test_bad_placement_options_are_refused(backend: str, runtime: dict, match: str) -> None:
    with pytest.raises(BackendError, match=match):
        backends.placement_for(backend, runtime)

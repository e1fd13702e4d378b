"""The original OmniRT's Python and CLI requests, run as its users wrote them, on real daemons.

The request files under tests/fixtures/original/requests/ are the original's documented examples
(its quickstart, generation and validation guides), kept field for field at a tiny model's
size. A user catalog stands the original's model ids in for tiny models (sdxl-base-1.0 and
flux2.dev are tiny-sd's weights, wan2.2-t2v-14b tiny-wan's, svd-xt tiny-svd's), so every
request runs under the id it names. One controller and one worker serve the module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

import omnirt
from omnirt import errors
from omnirt.requests import edit, image2image, image2video, text2image, text2video
from tests.daemons import Controller, Worker

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "original" / "requests"

ORIGINAL_IDS = (Path(__file__).resolve().parents[1] / "fixtures" / "original" / "stand_ins.toml").read_text()


@pytest.fixture(scope="module")
def user_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Overrides conftest's catalog: the original's ids on tiny weights."""
    path = tmp_path_factory.mktemp("catalog") / "original_ids.toml"
    path.write_text(ORIGINAL_IDS)
    return path


@pytest.fixture(scope="module")
def address(controller: Controller, worker: Worker) -> str:
    return controller.address


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's folder: the original's relative paths (inputs/portrait.png, outputs/) are in it."""
    (tmp_path / "inputs").mkdir()
    Image.new("RGB", (64, 64), (200, 40, 40)).save(tmp_path / "inputs" / "portrait.png")
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def png_size(path: str | Path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


# ---- Python: omnirt.generate ------------------------------------------------------------------


def test_generate_runs_the_original_yaml_file_and_answers_in_its_shape(address: str, workdir: Path) -> None:
    result = omnirt.generate(str(FIXTURES / "py_text2image.yaml"), address=address, timeout=120)
    (output,) = result.outputs
    assert (output.kind, output.mime, output.width, output.height) == ("image", "image/png", 64, 64)
    saved = Path(output.path)
    assert saved.parent == Path("outputs"), "the original's default output folder, under the cwd"
    assert png_size(workdir / saved) == (64, 64)
    meta = result.metadata
    assert (meta.model, meta.task, meta.worker_id, meta.schema_version) == (
        "flux2.dev",
        "text2image",
        "w-main",
        "1.0.0",
    )
    assert meta.execution_mode == "legacy_call" and meta.trace_id and meta.run_id == meta.job_id
    assert meta.config_resolved["num_inference_steps"] == 3, "the file's preset: balanced"
    assert 0 < meta.timings["denoise"] < 60, "timings are in seconds"
    # to_dict() is the original's JSON, and the guides' names read the same objects.
    data = json.loads(json.dumps(result.to_dict()))
    assert data["outputs"][0]["path"] == output.path and data["metadata"]["model"] == "flux2.dev"
    assert result.artifacts[0] is output and result.report is meta


def test_generate_runs_a_json_file_reading_its_relative_image_locally(address: str, workdir: Path) -> None:
    result = omnirt.generate(FIXTURES / "py_image2image.json", address=address, timeout=120)
    assert result.metadata.task == "image2image" and result.metadata.model == "sdxl-base-1.0"
    assert abs(result.metadata.config_resolved["strength"] - 0.7) < 1e-6
    assert png_size(result.outputs[0].path) == (64, 64)


def test_generate_takes_a_dict_and_a_builder_saving_where_asked(address: str, workdir: Path) -> None:
    payload = {
        "task": "text2image",
        "model": "sdxl-base-1.0",
        "inputs": {"prompt": "a lighthouse in fog"},
        "config": {"seed": 5, "output_dir": "renders"},
    }
    first = omnirt.generate(payload, address=address, timeout=60)
    assert Path(first.outputs[0].path).parent == Path("renders"), "config.output_dir, as the original"
    # The keyword wins over the file's folder; the same seed gives the same image.
    again = omnirt.generate(payload, address=address, output_dir=workdir / "elsewhere", timeout=60)
    assert Path(again.outputs[0].path).parent == workdir / "elsewhere"
    assert Path(again.outputs[0].path).read_bytes() == Path(first.outputs[0].path).read_bytes()
    # An edit (the original's task name stays in the answer) from the builder, $OMNIRT_CONTROLLER.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMNIRT_CONTROLLER", address)
        edited = omnirt.generate(
            edit(
                model="sdxl-base-1.0",
                image="inputs/portrait.png",
                prompt="make it blue",
                num_inference_steps=2,
            ),
            timeout=60,
        )
    assert edited.metadata.task == "edit" and png_size(edited.outputs[0].path) == (64, 64)


def test_a_refused_request_raises_the_typed_error_and_runs_nothing(address: str, workdir: Path) -> None:
    with pytest.raises(errors.InvalidRequest, match="multiple of 8") as refused:
        omnirt.generate(FIXTURES / "py_text2image_invalid.yaml", address=address)
    assert refused.value.field == "config.width", "the field as the original's request names it"
    with pytest.raises(errors.InvalidRequest, match=r"config\.device_map: not set per request") as elsewhere:
        omnirt.generate(
            {"model": "sdxl-base-1.0", "inputs": {"prompt": "x"}, "config": {"device_map": "auto"}},
            address=address,
        )
    assert elsewhere.value.field == "config.device_map"
    assert not (workdir / "outputs").exists()


# ---- Python: omnirt.validate ------------------------------------------------------------------


def test_validate_ok_resolves_the_request_for_every_builder(address: str, workdir: Path) -> None:
    requests = [
        text2image(model="sdxl-base-1.0", prompt="a lighthouse", preset="fast"),
        image2image(model="sdxl-base-1.0", image="inputs/portrait.png", prompt="oil", strength=0.7),
        text2video(model="wan2.2-t2v-14b", prompt="aerial view", num_frames=9, fps=8, preset="balanced"),
        image2video(model="svd-xt", image="inputs/portrait.png", num_frames=4, fps=7, preset="balanced"),
    ]
    for request in requests:
        found = omnirt.validate(request, address=address)
        assert found.ok and found.issues == [], found.to_dict()
        assert found.model_spec is not None and found.model_spec.id == request.model
        assert found.model_spec.task == request.task and found.resolved_backend == "auto"
        assert found.request == request and found.to_dict()["ok"] is True
    video = omnirt.validate(requests[2], address=address)
    assert (video.resolved_config["num_frames"], video.resolved_config["output_format"]) == (9, "mp4")
    # The original's backend= keyword: checked, and said to pin the job to that backend's workers.
    cuda = omnirt.validate(requests[0], address=address, backend="cuda")
    assert cuda.ok and "--backend" in cuda.warnings[0].message


def test_validate_a_bad_request_is_not_ok_and_says_why(address: str, workdir: Path) -> None:
    width = omnirt.validate(FIXTURES / "py_text2image_invalid.yaml", address=address)
    assert not width.ok and width.to_dict()["ok"] is False
    (error,) = width.errors
    assert error.message.startswith("config.width: must be a multiple of 8") and "513" in error.message
    assert width.format_errors() == f"- {error.message}"
    cases = [
        (
            "inputs.image: no such local file",
            image2image(model="sdxl-base-1.0", image="none.png", prompt="x"),
        ),
        (
            "'sdxl-base-1.1' not found; did you mean sdxl-base-1.0",
            text2image(model="sdxl-base-1.1", prompt="x"),
        ),
        (
            "config.model_path: not set per request",
            {"model": "sdxl-base-1.0", "config": {"model_path": "/w"}},
        ),
        (
            "backend: 'tpu' is not one of auto, cuda",
            text2image(model="sdxl-base-1.0", prompt="x", backend="tpu"),
        ),
    ]
    for words, request in cases:
        found = omnirt.validate(request, address=address)
        assert not found.ok and words in found.errors[0].message, found.to_dict()


# ---- Python: the catalog as the original's registry -------------------------------------------


def test_list_available_models_and_describe_model(address: str) -> None:
    specs = {spec.id: spec for spec in omnirt.list_available_models(address=address)}
    assert specs["sdxl-base-1.0"].task == "text2image" and specs["wan2.2-t2v-14b"].task == "text2video"
    assert specs["tiny-stable-diffusion"].capabilities.alias_of == "tiny-sd"
    assert list(specs) == sorted(specs)
    ids = {spec.id for spec in omnirt.list_available_models(include_aliases=False, address=address)}
    assert "sdxl-base-1.0" in ids and "tiny-stable-diffusion" not in ids
    assert {s.id for s in omnirt.list_available_models(tier="core", address=address)} == set(specs)
    with pytest.raises(ValueError, match="Unknown model tier"):
        omnirt.list_available_models(tier="gold", address=address)

    spec = omnirt.describe_model("sdxl-base-1.0", task="image2image", address=address)
    assert (spec.id, spec.task, spec.pipeline_cls) == (
        "sdxl-base-1.0",
        "image2image",
        "StableDiffusionPipeline",
    )
    assert spec.capabilities.required_inputs == ("prompt", "image")
    assert (
        spec.capabilities.default_config["width"] == 64
        and "num_images_per_prompt" in spec.capabilities.supported_config
    )
    video = omnirt.describe_model("svd-xt", address=address)
    assert (video.task, video.capabilities.artifact_kind, video.capabilities.required_inputs) == (
        "image2video",
        "video",
        ("image",),
    )
    with pytest.raises(errors.ModelNotFound, match="with task 'text2video' is not registered"):
        omnirt.describe_model("sdxl-base-1.0", task="text2video", address=address)
    with pytest.raises(errors.ModelNotFound):
        omnirt.describe_model("sdxl-base-9", address=address)


# ---- omnirtctl --config -----------------------------------------------------------------------


def omnirtctl(address: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("omnirtctl", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "omnirt.cli.main"]
    env = {**os.environ, "OMNIRT_CONTROLLER": address}
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_cli_generate_config_writes_the_files_of_the_original_request(address: str, workdir: Path) -> None:
    proc = omnirtctl(
        address, workdir, "generate", "--config", str(FIXTURES / "py_text2image_output_dir.yaml")
    )
    assert proc.returncode == 0, proc.stderr
    (saved,) = (workdir / "lighthouse").glob("*.png")
    assert str(Path("lighthouse") / saved.name) in proc.stdout and "sdxl-base-1.0" in proc.stdout
    # --json prints what omnirt.generate(FILE).to_dict() gives; --out wins over config.output_dir.
    proc = omnirtctl(
        address,
        workdir,
        "--json",
        "generate",
        "--config",
        str(FIXTURES / "py_image2image.json"),
        "--out",
        "o",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (output,) = data["outputs"]
    assert png_size(workdir / output["path"]) == (64, 64) and Path(output["path"]).parent == Path("o")
    assert data["metadata"]["task"] == "image2image" and data["metadata"]["schema_version"] == "1.0.0"


def test_cli_validate_config_answers_as_the_original(address: str, workdir: Path) -> None:
    ok = omnirtctl(address, workdir, "validate", "--config", str(FIXTURES / "py_text2image.yaml"))
    assert ok.returncode == 0, ok.stderr
    assert "flux2.dev" in ok.stdout and "num_inference_steps: 3" in ok.stdout
    bad = omnirtctl(address, workdir, "validate", "--config", str(FIXTURES / "py_text2image_invalid.yaml"))
    assert bad.returncode == 1 and "error: config.width: must be a multiple of 8" in bad.stderr
    bad_json = omnirtctl(
        address, workdir, "--json", "validate", "--config", str(FIXTURES / "py_text2image_invalid.yaml")
    )
    found = json.loads(bad_json.stdout)
    assert bad_json.returncode == 1 and found["ok"] is False and found["request"]["config"] == {"width": 513}
    (issue,) = found["issues"]
    assert issue["level"] == "error" and issue["message"].startswith("config.width: must be a multiple of 8")
    refused = omnirtctl(
        address, workdir, "generate", "--config", str(FIXTURES / "py_text2image_invalid.yaml")
    )
    assert (
        refused.returncode == 1
        and "error: INVALID_ARGUMENT: config.width: must be a multiple of 8" in refused.stderr
    )
    # The original's `generate --config FILE --dry-run` validates only.
    dry = omnirtctl(
        address, workdir, "generate", "--dry-run", "--config", str(FIXTURES / "py_text2image_invalid.yaml")
    )
    assert dry.returncode == 1 and "multiple of 8" in dry.stderr and not (workdir / "outputs").exists()


def test_cli_config_usage_errors(address: str, workdir: Path) -> None:
    mixed = omnirtctl(
        address, workdir, "generate", "--config", str(FIXTURES / "py_text2image.yaml"), "--seed", "3"
    )
    assert mixed.returncode == 2 and "--config replaces the request flags (got --seed)" in mixed.stderr
    neither = omnirtctl(address, workdir, "validate")
    assert (
        neither.returncode == 2 and "one of the arguments --model/-m --config is required" in neither.stderr
    )
    both = omnirtctl(
        address, workdir, "validate", "--config", str(FIXTURES / "py_text2image.yaml"), "-m", "x"
    )
    assert both.returncode == 2 and "not allowed with argument --config" in both.stderr
    (workdir / "list.yaml").write_text("- task: text2image\n")
    not_one = omnirtctl(address, workdir, "generate", "--config", "list.yaml")
    assert not_one.returncode == 2 and "holds one object" in not_one.stderr


def test_yaml_without_pyyaml_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['yaml'] = None\n"
        "from omnirt.requests import OriginalRequest\n"
        f"OriginalRequest.from_file({str(FIXTURES / 'py_text2image.yaml')!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "needs PyYAML: pip install 'omnirt[yaml]'" in proc.stderr

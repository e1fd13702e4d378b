"""WorkerConfig from flags and OMNIRT_* environment variables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from omnirt._internal import config as _config
from omnirt.worker.config import WorkerConfig
from omnirt.worker.main import build_parser, load_config


def _config_from(argv: list[str], environ: dict[str, str] | None = None) -> WorkerConfig:
    args = build_parser().parse_args(argv)
    return _config.from_args(WorkerConfig, args, environ or {})


def test_defaults() -> None:
    config = _config_from([])
    assert config.controller == "127.0.0.1:50051"
    assert (config.mode, config.backend, config.models, config.slots) == ("legacy_call", "cpu", [], 1)
    assert config.model_dir == os.path.expanduser("~/.cache/omnirt/models")
    assert config.worker_id == f"{socket.gethostname()}-{os.getpid()}"
    assert (config.drain_timeout_s, config.reconnect_max_s, config.torch_threads) == (120.0, 5.0, 0)
    assert (config.log_json, config.log_level) == (False, "INFO")


def test_flags() -> None:
    config = _config_from(
        [
            "--controller=ctl:9000",
            "--backend=auto",
            "--models=tiny-sd,sd15",
            "--models",
            "wan",
            "--slots=3",
            "--model-dir=/srv/models",
            "--worker-id=w-7",
            "--drain-timeout-s=2.5",
            "--reconnect-max-s=1",
            "--torch-threads=2",
            "--log-json",
            "--log-level=debug",
        ]
    )
    assert config.controller == "ctl:9000"
    assert config.backend == "auto"
    assert config.models == ["tiny-sd", "sd15", "wan"]
    assert (config.slots, config.model_dir, config.worker_id) == (3, "/srv/models", "w-7")
    assert (config.drain_timeout_s, config.reconnect_max_s, config.torch_threads) == (2.5, 1.0, 2)
    assert (config.log_json, config.log_level) == (True, "DEBUG")


def test_environment_and_precedence() -> None:
    environ = {
        "OMNIRT_CONTROLLER": "env-ctl:1",
        "OMNIRT_MODELS": "a, b",
        "OMNIRT_SLOTS": "4",
        "OMNIRT_LOG_JSON": "true",
        "OMNIRT_MODEL_DIR": "~/m",
    }
    config = _config_from(["--slots=2"], environ)
    assert config.controller == "env-ctl:1"
    assert config.models == ["a", "b"]
    assert config.slots == 2  # the flag wins over the environment
    assert config.log_json is True
    assert config.model_dir == os.path.expanduser("~/m")


def test_every_field_has_help_and_a_flag() -> None:
    help_text = build_parser().format_help()
    for name in WorkerConfig.__dataclass_fields__:
        field = WorkerConfig.__dataclass_fields__[name]
        assert field.metadata.get("help"), name
        assert "--" + name.replace("_", "-") in help_text
        assert _config.env_name(name) in help_text


@pytest.mark.parametrize(
    "argv",
    [["--mode=nope"], ["--backend=tpu"], ["--slots=0"], ["--log-level=LOUD"], ["--reconnect-max-s=0"]],
)
def test_bad_values_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_config(argv)
    assert exit_info.value.code == 2
    assert "omnirt-worker" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "shown"),
    [
        ("omnirt.controller.main", ["[default: 10000; OMNIRT_MAX_QUEUE]", "default: 60;", "default: off;"]),
        ("omnirt.worker.main", ["[default: 1; OMNIRT_SLOTS]", "default: on;", "default: none;"]),
    ],
)
def test_the_daemons_help_shows_each_flags_default(module: str, shown: list[str]) -> None:
    text = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    flat = " ".join(text.split())  # argparse wraps lines
    for piece in shown:
        assert piece in flat, piece

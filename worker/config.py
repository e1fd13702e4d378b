"""`WorkerConfig`: everything the worker daemon is told at start.

Flags (`--slots`) and environment variables (`OMNIRT_SLOTS`) derive from the fields through
`omnirt._internal.config`; precedence is flag, then environment, then the default below.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from omnirt._internal.limits import DEFAULT_INPUT_MAX_BYTES
from omnirt._internal.modes import DEFAULT_MODE, EXECUTION_MODES, ExecutionMode
from omnirt._internal.object_store import StoreLocation

BACKENDS = ("auto", "cpu", "cuda", "ascend")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def default_worker_id() -> str:
    """A worker id unique on this host for this process: `HOSTNAME-PID`."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    """Configuration of one worker process (one execution mode on one backend)."""

    controller: str = field(
        default="127.0.0.1:50051", metadata={"help": "controller address (host:port) to connect to"}
    )
    mode: str = field(
        default=DEFAULT_MODE.value, metadata={"help": "execution mode: " + ", ".join(EXECUTION_MODES)}
    )
    backend: str = field(
        default="cpu", metadata={"help": "backend: cpu, cuda, ascend or auto (cuda, then ascend, then cpu)"}
    )
    models: list[str] = field(
        default_factory=list,
        metadata={"help": "catalog model ids this worker serves; empty = every model of its mode"},
    )
    slots: int = field(default=1, metadata={"help": "assignments run at the same time"})
    session_slots: int = field(
        default=1,
        metadata={"help": "realtime sessions hosted at the same time (0 = none; docs/worker.md)"},
    )
    preload: bool | None = field(
        default=None,
        metadata={
            "help": "make the --models warm at start-up, before their first request "
            "(default: on for persistent_worker, off for the other modes)"
        },
    )
    model_dir: str = field(
        default="~/.cache/omnirt/models", metadata={"help": "folder for models OmniRT builds (builtin:NAME)"}
    )
    worker_id: str = field(default="", metadata={"help": "stable worker id; empty = HOSTNAME-PID"})
    drain_timeout_s: float = field(
        default=120.0, metadata={"help": "seconds a drain waits for running jobs before stopping them"}
    )
    reconnect_max_s: float = field(
        default=5.0, metadata={"help": "longest wait between reconnect attempts, in seconds"}
    )
    torch_threads: int = field(default=0, metadata={"help": "torch CPU threads; 0 = torch's default"})
    progress_interval_ms: int = field(
        default=250,
        metadata={
            "help": "a run's progress and stage events go to the controller at least this often, "
            "in batches (0 = each at once; each delivery takes the GIL from the pipeline thread)"
        },
    )
    step_engine: bool = field(
        default=True,
        metadata={
            "help": "legacy_call: concurrent calls of SD, SDXL, SD3, Flux and Wan models share each "
            "denoiser step (docs/worker.md, the step engine); --no-step-engine runs each call alone"
        },
    )
    step_rows: int = field(
        default=16,
        metadata={"help": "step engine: most rows in one denoiser forward (guidance doubles a row)"},
    )
    step_max_paused: int = field(
        default=2,
        metadata={"help": "step engine: batches paused for a more urgent one; beyond, the urgent one waits"},
    )
    step_max_paused_bytes: int = field(
        default=0,
        metadata={"help": "step engine: bytes of inputs the paused batches may hold (0 = no bound)"},
    )
    step_max_pause_s: float = field(
        default=30.0,
        metadata={
            "help": "step engine: a paused batch resumes after this many seconds (or 8 passed-over steps)"
        },
    )
    model_cache_bytes: int = field(
        default=0,
        metadata={"help": "memory budget of loaded models (parameters + buffers), bytes; 0 = unlimited"},
    )
    script_dirs: list[str] = field(
        default_factory=list,
        metadata={"help": "subprocess mode: folders searched for relative command paths (then examples/)"},
    )
    input_roots: list[str] = field(
        default_factory=list,
        metadata={
            "help": "folders file:// inputs may be read from (symlinks resolved first); "
            "empty = file:// inputs are refused"
        },
    )
    input_max_bytes: int = field(
        default=DEFAULT_INPUT_MAX_BYTES,
        metadata={"help": "largest file:// input the worker reads, in bytes"},
    )
    metrics: str = field(
        default="",
        metadata={
            "help": "serve HTTP on HOST:PORT or PORT: Prometheus /metrics and the probes /readyz (a live "
            "stream to the controller) and /livez (empty = off, probes included)"
        },
    )
    # ---- artifact store (docs/artifacts.md) ----
    artifact_store: str = field(
        default="",
        metadata={
            "help": "s3://BUCKET[/PREFIX]: upload outputs there when the controller uses the same "
            "store (only the reference crosses the stream); empty = bytes go to the controller"
        },
    )
    artifact_store_endpoint: str = field(
        default="",
        metadata={"help": "S3 endpoint URL, e.g. http://minio:9000 (empty = AWS_ENDPOINT_URL, else AWS)"},
    )
    artifact_store_region: str = field(
        default="", metadata={"help": "S3 region (empty = AWS_REGION / the AWS profile's)"}
    )
    artifact_store_multipart_threshold_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata={"help": "outputs this large or larger upload in parts (parts are at least 5 MiB)"},
    )
    log_json: bool = field(default=False, metadata={"help": "log one JSON object per line"})
    log_level: str = field(default="INFO", metadata={"help": "log level: DEBUG, INFO, WARNING, ERROR"})
    # ---- security (docs/worker.md, "Joining a secured controller") ----
    token_file: str = field(
        default="",
        metadata={
            "help": "file holding the token the controller admits workers by (re-read at each reconnect)"
        },
    )
    tls: bool = field(
        default=False, metadata={"help": "connect over TLS, verifying the controller against the system CAs"}
    )
    tls_ca: str = field(
        default="",
        metadata={"help": "PEM CA bundle the controller's certificate must chain to (implies --tls)"},
    )
    tls_cert: str = field(
        default="", metadata={"help": "PEM client certificate for mTLS, with --tls-key (implies --tls)"}
    )
    tls_key: str = field(default="", metadata={"help": "PEM private key of --tls-cert"})
    tls_server_name: str = field(
        default="",
        metadata={
            "help": "name to check the controller's certificate against instead of the host of "
            "--controller (implies --tls)"
        },
    )

    def __post_init__(self) -> None:
        # Frozen: normalized values are written once, here, so every reader sees the same.
        object.__setattr__(self, "model_dir", os.path.abspath(os.path.expanduser(self.model_dir)))
        object.__setattr__(self, "worker_id", self.worker_id or default_worker_id())
        object.__setattr__(self, "models", list(self.models))
        roots = [os.path.abspath(os.path.expanduser(r)) for r in self.input_roots]
        object.__setattr__(self, "input_roots", roots)
        object.__setattr__(self, "log_level", self.log_level.upper())
        if self.tls_ca or self.tls_cert or self.tls_key or self.tls_server_name:
            object.__setattr__(self, "tls", True)
        if self.preload is None:  # a resident group takes long to start: start it before any user waits
            object.__setattr__(self, "preload", self.mode == ExecutionMode.PERSISTENT_WORKER)
        if self.mode not in EXECUTION_MODES:
            raise ValueError(f"mode must be one of {', '.join(EXECUTION_MODES)}, not {self.mode!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, not {self.slots}")
        if self.session_slots < 0:
            raise ValueError(f"session_slots must be >= 0, not {self.session_slots}")
        if self.drain_timeout_s < 0 or self.reconnect_max_s <= 0:
            raise ValueError("drain_timeout_s must be >= 0 and reconnect_max_s > 0")
        if self.torch_threads < 0:
            raise ValueError(f"torch_threads must be >= 0, not {self.torch_threads}")
        if self.progress_interval_ms < 0:
            raise ValueError(f"progress_interval_ms must be >= 0, not {self.progress_interval_ms}")
        if self.step_rows < 1 or self.step_max_paused < 0 or self.step_max_paused_bytes < 0:
            raise ValueError("step_rows must be at least 1; step_max_paused and step_max_paused_bytes >= 0")
        if self.step_max_pause_s <= 0:
            raise ValueError(f"step_max_pause_s must be > 0, not {self.step_max_pause_s}")
        if self.input_max_bytes < 1:
            raise ValueError(f"input_max_bytes must be at least 1, not {self.input_max_bytes}")
        if self.model_cache_bytes < 0:
            raise ValueError(f"model_cache_bytes must be >= 0, not {self.model_cache_bytes}")
        if self.artifact_store:
            StoreLocation.parse(self.artifact_store)  # ValueError naming what is wrong
        if self.artifact_store_multipart_threshold_bytes < 1:
            raise ValueError(
                "artifact_store_multipart_threshold_bytes must be at least 1, "
                f"not {self.artifact_store_multipart_threshold_bytes}"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: the client certificate needs its key")

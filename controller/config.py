"""Controller configuration: one frozen dataclass; flags and OMNIRT_* variables derive from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from omnirt._internal.limits import MAX_MESSAGE_BYTES
from omnirt._internal.object_store import StoreLocation


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of `omnirt-controller`."""

    listen: str = field(default="127.0.0.1:50051", metadata={"help": "gRPC address to serve on, HOST:PORT"})
    catalog: tuple[str, ...] = field(
        default=(), metadata={"help": "extra catalog file (TOML or JSON) added to the built-in one"}
    )
    max_queue: int = field(
        default=10000, metadata={"help": "queued jobs before Submit answers RESOURCE_EXHAUSTED"}
    )
    unserved_wait_s: float = field(
        default=60.0,
        metadata={
            "help": "seconds a queued job waits while no connected worker serves its model, then it fails "
            "FAILED_PRECONDITION (0 = refuse it at submit, negative = wait; --expected-models always wait)"
        },
    )
    expected_models: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "models the deployment's worker pools serve (they may scale from zero): their jobs wait "
            "for a worker to start, whatever --unserved-wait-s says (* = every model)"
        },
    )
    shutdown_grace_s: float = field(
        default=30.0,
        metadata={
            "help": "at SIGTERM, seconds the calls in flight may take to finish (new calls are refused, "
            "streams end, then the workers are told to reconnect)"
        },
    )
    priority_aging_s: float = field(
        default=30.0,
        metadata={"help": "seconds of waiting that raise a job's priority by one (0 = no aging)"},
    )
    max_batch_size: int = field(
        default=8, metadata={"help": "most jobs in one pipeline call for models that batch (1 = no batching)"}
    )
    batch_window_ms: int = field(
        default=0,
        metadata={"help": "how long a batchable job may wait for companions (0 = batch only what is queued)"},
    )
    batch_busy_window_ms: int = field(
        default=2,
        metadata={
            "help": "how long a batchable job may wait for companions while other jobs of its model "
            "run (0 = off; an idle model's job never waits for it)"
        },
    )
    max_attempts: int = field(default=3, metadata={"help": "runs of a job before a lost worker fails it"})
    heartbeat_interval_ms: int = field(default=1000, metadata={"help": "how often workers send heartbeats"})
    lease_timeout_ms: int = field(
        default=5000, metadata={"help": "a worker silent this long loses its lease and its jobs"}
    )
    inline_limit_bytes: int = field(
        default=8 * 1024 * 1024, metadata={"help": "larger artifacts go by DownloadArtifact, not inline"}
    )
    max_message_bytes: int = field(default=MAX_MESSAGE_BYTES, metadata={"help": "gRPC message size limit"})
    max_finished_jobs: int = field(default=10000, metadata={"help": "finished jobs kept in memory"})
    session_max_duration_s: float = field(
        default=3600.0, metadata={"help": "a realtime session ends after this long (0 = never)"}
    )
    job_ttl_s: float = field(default=3600.0, metadata={"help": "seconds a finished job stays readable"})
    store: str = field(
        default="memory",
        metadata={
            "help": "where jobs live: memory, or redis://HOST:PORT/DB (durable, shared by controllers)"
        },
    )
    idempotency_ttl_s: float = field(
        default=86400.0, metadata={"help": "seconds an idempotency key maps to its job (redis store)"}
    )
    store_artifact_limit_bytes: int = field(
        default=1024 * 1024,
        metadata={"help": "artifacts larger than this go to --artifact-dir, not into Redis (redis store)"},
    )
    artifact_dir: str = field(
        default="",
        metadata={
            "help": "directory for large artifacts of the redis store; shared by every controller "
            "(empty = a folder under the system temp dir)"
        },
    )
    # ---- artifact store (docs/artifacts.md) ----
    artifact_store: str = field(
        default="",
        metadata={
            "help": "s3://BUCKET[/PREFIX]: artifacts of workers with the same store live there; "
            "clients get presigned URLs (empty = controller memory, Redis or --artifact-dir)"
        },
    )
    artifact_store_endpoint: str = field(
        default="",
        metadata={"help": "S3 endpoint URL, e.g. http://minio:9000 (empty = AWS_ENDPOINT_URL, else AWS)"},
    )
    artifact_store_region: str = field(
        default="", metadata={"help": "S3 region (empty = AWS_REGION / the AWS profile's)"}
    )
    artifact_url_ttl_s: float = field(
        default=3600.0,
        metadata={"help": "presigned artifact URLs work this long, never past --job-ttl-s (0 = no URLs)"},
    )
    artifact_store_sweep_s: float = field(
        default=60.0,
        metadata={"help": "how often objects older than --job-ttl-s are deleted from the store (0 = never)"},
    )
    http: str = field(
        default="",
        metadata={"help": "HTTP/JSON gateway, OpenAI routes and /metrics on HOST:PORT (empty = off)"},
    )
    http_max_body_bytes: int = field(
        default=64 * 1024 * 1024, metadata={"help": "largest HTTP request body the gateway accepts"}
    )
    log_json: bool = field(default=False, metadata={"help": "log one JSON object per line"})
    log_level: str = field(default="INFO", metadata={"help": "log level"})
    # ---- security (docs/operations.md, "Securing a deployment") ----
    tls_cert: str = field(
        default="", metadata={"help": "PEM certificate chain: gRPC and HTTP over TLS (reloaded on SIGHUP)"}
    )
    tls_key: str = field(default="", metadata={"help": "PEM private key of --tls-cert"})
    tls_client_ca: str = field(
        default="",
        metadata={
            "help": "PEM CA bundle: require client certificates it signed on the worker port "
            "(--worker-listen), or on the one port when there is no worker port"
        },
    )
    tls_public_client_auth: bool = field(
        default=False,
        metadata={"help": "also require client certificates on the public API (gRPC and HTTP)"},
    )
    worker_listen: str = field(
        default="",
        metadata={"help": "serve the worker stream on its own HOST:PORT (empty = on --listen)"},
    )
    auth_keys: str = field(
        default="",
        metadata={"help": "TOML file of API keys (tenant, role, sha256, quotas); reloaded on SIGHUP"},
    )
    worker_token_file: str = field(
        default="", metadata={"help": "file holding the token workers must present to connect"}
    )
    metrics_auth: bool = field(
        default=False, metadata={"help": "/metrics needs an admin key (default: open, like /healthz)"}
    )
    insecure: bool = field(
        default=False,
        metadata={"help": "allow a non-loopback listen address without API keys or a worker token"},
    )
    cors_origin: tuple[str, ...] = field(
        default=(), metadata={"help": "origin allowed to call the HTTP gateway from a browser"}
    )
    audit_log: str = field(
        default="", metadata={"help": "file to append the JSON audit log to (empty = stderr)"}
    )
    # ---- webhooks (docs/webhooks.md) ----
    webhook_allow: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "CIDR or host name webhooks may reach although private, loopback or link-local "
            "(e.g. 10.0.0.0/8, hooks.internal)"
        },
    )
    webhook_secret_file: str = field(
        default="",
        metadata={
            "help": "file holding the master secret each tenant's webhook signing secret derives from "
            "(empty = a random one, kept in Redis with --store redis://)"
        },
    )
    webhook_timeout_s: float = field(default=10.0, metadata={"help": "seconds one webhook delivery may take"})
    webhook_retry_s: float = field(
        default=3600.0,
        metadata={"help": "seconds a failing webhook is retried (with backoff) before deliveries give up"},
    )
    webhook_backoff_s: float = field(
        default=1.0, metadata={"help": "first retry delay of a failed webhook delivery (doubles, capped)"}
    )
    webhook_max_jobs: int = field(
        default=1000, metadata={"help": "jobs whose webhooks one controller serves at once (more wait)"}
    )
    webhook_base_url: str = field(
        default="",
        metadata={
            "help": "base URL of the gateway that webhook receivers fetch artifacts from, e.g. "
            "https://omnirt.example.com (empty = http(s)://--http)"
        },
    )
    webhook_lease_s: float = field(
        default=15.0,
        metadata={"help": "a dead controller's webhook deliveries move to another after this (redis store)"},
    )

    def __post_init__(self) -> None:
        if self.artifact_store:
            StoreLocation.parse(self.artifact_store)  # ValueError naming what is wrong
        if self.artifact_url_ttl_s < 0 or self.artifact_store_sweep_s < 0:
            raise ValueError("artifact_url_ttl_s and artifact_store_sweep_s must be >= 0")

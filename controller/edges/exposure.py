"""Secure by default: what the controller refuses to serve beyond loopback without credentials.

A controller reachable from the network with no API keys lets anyone run, read and cancel
everyone's jobs; one whose worker port admits any worker hands jobs (prompts, input images) to
whoever connects and takes forged results back. So a listen address other than loopback needs
`--auth-keys` for the public API and `--worker-token-file` or `--tls-client-ca` for workers,
unless `--insecure` says the network itself is trusted (a private test rig, a sidecar mesh).
"""

from __future__ import annotations

from omnirt._internal.address import is_loopback
from omnirt.controller.config import ControllerConfig


def exposure_error(config: ControllerConfig) -> str | None:
    """The line to exit with when `config` would expose an open edge, or None when it is safe."""
    if config.insecure:
        return None
    public = [a for a in (config.listen, config.http) if a and not is_loopback(a)]
    if public and not config.auth_keys:
        return (
            f"refusing to serve {public[0]} without API keys: pass --auth-keys FILE "
            "(or --insecure to let anyone who reaches the port use it)"
        )
    worker_port = config.worker_listen or config.listen
    if not is_loopback(worker_port) and not (config.worker_token_file or config.tls_client_ca):
        return (
            f"refusing to accept workers on {worker_port} without a worker token: pass "
            "--worker-token-file FILE or --tls-client-ca FILE (or --insecure to admit any worker)"
        )
    return None

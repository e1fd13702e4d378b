"""`omnirt-worker`: the worker daemon's command line.

Flags and `OMNIRT_*` environment variables come from `WorkerConfig`. SIGTERM or SIGINT
drains the worker (a second one stops running jobs at once); it exits 0 once drained.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys

import omnirt
from omnirt._internal import config as _config
from omnirt.worker import telemetry
from omnirt.worker.config import WorkerConfig
from omnirt.worker.daemon import WorkerDaemon
from omnirt.worker.runtime.backends import BackendError
from omnirt.worker.telemetry import setup_logging

log = logging.getLogger("omnirt.worker")


class ListenError(Exception):
    """The metrics address cannot be bound; the message is one line for the user."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one flag per WorkerConfig field)."""
    parser = argparse.ArgumentParser(
        prog="omnirt-worker",
        description="OmniRT worker: connects to the controller and runs generation jobs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {omnirt.__version__}")
    _config.add_arguments(parser, WorkerConfig)
    return parser


def load_config(argv: list[str] | None = None) -> WorkerConfig:
    """WorkerConfig from `argv` (default sys.argv) and the environment; exits 2 on a bad value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _config.from_args(WorkerConfig, args)
    except ValueError as exc:
        parser.error(str(exc))


async def serve(config: WorkerConfig) -> int:
    """Run the daemon until drained, draining on SIGTERM/SIGINT."""
    daemon = WorkerDaemon(config)
    if config.metrics:
        try:
            daemon.telemetry.serve(config.metrics)
        except OSError as exc:
            reason = "address in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
            raise ListenError(f"cannot listen on {config.metrics}: {reason}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_drain, sig.name)
    try:
        return await daemon.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    """Console entry point of `omnirt-worker`."""
    config = load_config(argv)
    setup_logging(config.log_level, config.log_json, config.worker_id)
    telemetry.setup_tracing("omnirt-worker")
    try:
        return asyncio.run(serve(config))
    except ListenError as exc:
        print(f"omnirt-worker: {exc}", file=sys.stderr)
        return 2
    except (BackendError, ValueError, OSError) as exc:
        # Startup failures (no such backend, unknown mode) end the process with a clear line.
        log.error("worker cannot start: %s", exc)
        return 2
    finally:
        telemetry.shutdown_tracing()


if __name__ == "__main__":
    sys.exit(main())

"""`omnirt-controller`: validates, queues and routes generation requests to workers."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from omnirt._internal.config import add_arguments, from_args
from omnirt._internal.logs import setup_logging
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import CatalogError
from omnirt.controller.edges.exposure import exposure_error
from omnirt.controller.observability import tracing

log = logging.getLogger("omnirt.controller")


async def serve(config: ControllerConfig) -> None:
    """Run until SIGTERM or SIGINT."""
    from omnirt.controller.server import ControllerServer

    server = ControllerServer(config)
    await server.start()
    # What startup made (modules, the catalog) lives as long as the process: kept out of the
    # collector's full passes, which otherwise walk all of it again every time.
    gc.collect()
    gc.freeze()
    # A line tools and tests can wait for (the port matters when listening on :0).
    print(f"omnirt-controller listening on {server.address}", flush=True)
    if server.http is not None:
        print(f"omnirt-controller HTTP gateway on {server.http.address}", flush=True)
    worker_address = getattr(server, "worker_address", None)
    if worker_address:
        print(f"omnirt-controller worker port on {worker_address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # SIGHUP: key file, worker token and certificates read again; streams stay open.
    loop.add_signal_handler(signal.SIGHUP, server.reload)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
    tracing.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnirt-controller", description=__doc__)
    add_arguments(parser, ControllerConfig)
    try:
        config = from_args(ControllerConfig, parser.parse_args(argv))
    except ValueError as exc:  # a flag value that cannot work (--artifact-store gs://...)
        parser.error(str(exc))
    setup_logging(config.log_level, config.log_json)
    for handler in logging.getLogger().handlers:
        handler.addFilter(tracing.JobTraceFilter())  # trace_id on every line that names a job
    refusal = exposure_error(config)
    if refusal:
        print(f"omnirt-controller: {refusal}", file=sys.stderr)
        return 2
    tracing.setup("omnirt-controller")
    from omnirt.controller.server import ListenError  # after parsing: --help stays quick

    try:
        asyncio.run(serve(config))
    except CatalogError as exc:
        print(f"omnirt-controller: bad catalog: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a key file, token file or certificate that cannot be used
        print(f"omnirt-controller: {exc}", file=sys.stderr)
        return 2
    except ListenError as exc:
        print(f"omnirt-controller: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"omnirt-controller: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

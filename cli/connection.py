"""How `omnirtctl` reaches the controller: address, TLS and API key, as global options.

Each option is accepted before or after the subcommand (`omnirtctl --tls-ca ca.pem jobs list`
and `omnirtctl jobs list --tls-ca ca.pem`). The environment variables are read by the SDK
itself (`OMNIRT_CONTROLLER`, `OMNIRT_TLS_CA`, `OMNIRT_API_KEY`), so the CLI and a program
using `omnirt.Client` connect the same way.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--tls-ca, --tls and --api-key; on subcommands they default to SUPPRESS (the top level's win)."""
    unset: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=unset,
        help="connect over TLS and trust this PEM CA file (default: $OMNIRT_TLS_CA)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="connect over TLS, trusting the system's root certificates",
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=unset,
        help="API key sent as 'authorization: Bearer KEY' (default: $OMNIRT_API_KEY, which keeps "
        "the key out of the process list)",
    )


def client_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `omnirt.Client` / `omnirt.AsyncClient` for the parsed options."""
    return {
        "tls": True if getattr(args, "tls", False) else None,  # None: TLS when a CA is given
        "ca": getattr(args, "tls_ca", None),
        "api_key": getattr(args, "api_key", None),
    }

"""`omnirtctl webhooks secret`: the secret that signs the caller's webhooks (docs/webhooks.md)."""

from __future__ import annotations

import argparse

from omnirt.cli.output import print_json
from omnirt.client import Client


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("webhooks", help="webhook signing secrets")
    sub = parser.add_subparsers(dest="webhooks_command", metavar="COMMAND", required=True)
    secret = sub.add_parser("secret", parents=[common], help="print the whsec_ secret receivers verify with")
    secret.add_argument("--tenant", default="", help="another tenant's secret (admin key only)")
    secret.set_defaults(handler=run_secret)


def run_secret(args: argparse.Namespace, client: Client) -> int:
    secret = client.webhook_secret(args.tenant)
    if args.json:
        print_json({"secret": secret, "tenant": args.tenant})
        return 0
    print(secret)
    return 0

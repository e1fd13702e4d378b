"""`omnirtctl sessions list`: the realtime sessions open now (every controller's, on Redis)."""

from __future__ import annotations

import argparse

from omnirt.cli.output import fmt_time, print_json, print_table
from omnirt.client import Client


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("sessions", help="open realtime sessions")
    sub = parser.add_subparsers(dest="sessions_command", metavar="COMMAND", required=True)
    listing = sub.add_parser("list", parents=[common], help="list open sessions")
    listing.add_argument("--model", default="", help="only sessions of this model id")
    listing.set_defaults(handler=run_list)


def run_list(args: argparse.Namespace, client: Client) -> int:
    sessions = client.list_sessions(args.model)
    if args.json:
        print_json(sessions)
        return 0
    rows = [
        (s.session_id, s.model, s.worker_id, s.controller, s.tenant or "-", fmt_time(s.opened_at))
        for s in sessions
    ]
    print_table(("ID", "MODEL", "WORKER", "CONTROLLER", "TENANT", "OPENED"), rows, empty="no open sessions")
    return 0

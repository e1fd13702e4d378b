"""`omnirtctl keys new | token | hash`: make API keys and worker tokens (no controller needed).

`keys new` prints a fresh key once, on stdout, and appends its `[[keys]]` entry (the key's
SHA-256, never the key) to `--file`, the controller's `--auth-keys` file; SIGHUP the controller
to load it. `keys token` writes a fresh worker token to a file only its owner can read.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import sys
from pathlib import Path

from omnirt.client import Client

KEY_BYTES = 32  # 256 bits of randomness, URL-safe base64: 43 characters
TOKEN_PREFIX = "omnirt_"
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("keys", help="make API keys and worker tokens")
    sub = parser.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    new = sub.add_parser("new", help="a new API key: prints it, appends its entry to --file")
    new.add_argument("--tenant", required=True, help="the tenant the key acts for")
    new.add_argument("--role", choices=("user", "admin"), default="user", help="user (default) or admin")
    new.add_argument("--name", help="names the key in the audit log (default TENANT-DATE)")
    new.add_argument(
        "--max-queued", type=int, default=0, help="the tenant's jobs queued + running (0 = no limit)"
    )
    new.add_argument(
        "--rate-per-s", type=float, default=0.0, help="the tenant's submissions a second (0 = no limit)"
    )
    new.add_argument(
        "--weight", type=float, default=1.0, help="the tenant's share against others (default 1)"
    )
    new.add_argument("--file", type=Path, help="key file to append to (default: print the entry on stderr)")
    new.set_defaults(handler=run_new)
    token = sub.add_parser("token", help="a new worker token, written to FILE (mode 0600)")
    token.add_argument("file", type=Path)
    token.set_defaults(handler=run_token)
    digest = sub.add_parser("hash", help="the SHA-256 a key file lists for the key read from stdin")
    digest.set_defaults(handler=run_hash)


def _entry(args: argparse.Namespace, key: str) -> str:
    from datetime import UTC, datetime

    name = args.name or f"{args.tenant}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    lines = [
        "[[keys]]",
        f'tenant = "{args.tenant}"',
        f'role = "{args.role}"',
        f'name = "{name}"',
        f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"',
    ]
    if args.max_queued:
        lines.append(f"max_queued = {args.max_queued}")
    if args.rate_per_s:
        lines.append(f"rate_per_s = {args.rate_per_s}")
    if args.weight != 1.0:
        lines.append(f"weight = {args.weight}")
    return "\n".join(lines) + "\n"


def run_new(args: argparse.Namespace, client: Client) -> int:
    # The controller's rule for tenant names (a test holds the two equal); the CLI imports no
    # controller code.
    if not TENANT_RE.fullmatch(args.tenant):
        print("error: --tenant must be 1-64 letters, digits, '.', '_' or '-'", file=sys.stderr)
        return 2
    if args.max_queued < 0 or args.rate_per_s < 0 or args.weight <= 0:
        print("error: --max-queued and --rate-per-s must be >= 0, --weight > 0", file=sys.stderr)
        return 2
    key = TOKEN_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    entry = _entry(args, key)
    if args.file is None:
        print(entry, file=sys.stderr, end="")
    else:
        old = args.file.read_text(encoding="utf-8") if args.file.exists() else ""
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(("\n" if old and not old.endswith("\n\n") else "") + entry)
    print(key)
    return 0


def run_token(args: argparse.Namespace, client: Client) -> int:
    fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(TOKEN_PREFIX + secrets.token_urlsafe(KEY_BYTES) + "\n")
    return 0


def run_hash(args: argparse.Namespace, client: Client) -> int:
    key = sys.stdin.readline().strip()
    if not key:
        print("error: no key on stdin", file=sys.stderr)
        return 2
    print(hashlib.sha256(key.encode()).hexdigest())
    return 0

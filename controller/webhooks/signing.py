"""Webhook signatures the Standard Webhooks way, with one secret per tenant.

Each tenant's secret is derived, not stored: HMAC-SHA256(master, "omnirt-webhook-secret:" +
tenant). The master comes from `--webhook-secret-file`, so every controller given the same file
signs with the same secrets and none has to be written anywhere; without the file a random
master is made (and, on Redis, shared through it: see `dispatcher.shared_master`). A tenant
reads its own secret with `GenerationService.GetWebhookSecret` (`omnirtctl webhooks secret`).

Signature: `webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>` where
key is the secret's bytes (the base64 after `whsec_`), as in https://www.standardwebhooks.com.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

PREFIX = "whsec_"
MASTER_BYTES = 32
MIN_MASTER_BYTES = 16


def read_master(path: str) -> bytes:
    """The master secret in `path` (its bytes, surrounding whitespace stripped); ValueError if short."""
    try:
        data = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"--webhook-secret-file: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) < MIN_MASTER_BYTES:
        raise ValueError(
            f"--webhook-secret-file: {path} holds {len(data)} bytes; at least {MIN_MASTER_BYTES}"
        )
    return data


def random_master() -> bytes:
    """A fresh master secret (hex, so it can be written to a file as is)."""
    return os.urandom(MASTER_BYTES).hex().encode()


class Signer:
    """Signs deliveries with each tenant's key, derived from one master secret."""

    def __init__(self, master: bytes) -> None:
        self.master = master

    def key(self, tenant: str) -> bytes:
        """The tenant's signing key."""
        return hmac.new(self.master, b"omnirt-webhook-secret:" + tenant.encode(), hashlib.sha256).digest()

    def secret(self, tenant: str) -> str:
        """The tenant's secret as Standard Webhooks libraries take it: `whsec_<base64 key>`."""
        return PREFIX + base64.b64encode(self.key(tenant)).decode()

    def headers(self, tenant: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers of one delivery."""
        signed = f"{msg_id}.{timestamp}.".encode() + body
        digest = hmac.new(self.key(tenant), signed, hashlib.sha256).digest()
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": "v1," + base64.b64encode(digest).decode(),
        }

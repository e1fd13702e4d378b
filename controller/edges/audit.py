"""The audit log: one JSON line per authentication failure, admin action and worker admission.

It is its own logger (`omnirt.audit`), not the controller's log: it goes to `--audit-log FILE`
(appended) or to stderr, always as JSON, whatever `--log-json` says, and never carries a key
or a token. Failures from one peer are capped (`MAX_FAILURES_PER_S` lines a second); the lines
left out are counted in the next one (`suppressed`), so a flood of bad keys cannot flood the log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

MAX_FAILURES_PER_S = 20
MAX_VALUE_CHARS = 256


class AuditLog:
    """Writes audit records; `lines` keeps the last few for tests and the console."""

    def __init__(self, path: str = "") -> None:
        self.logger = logging.getLogger("omnirt.audit")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        for old in list(self.logger.handlers):
            self.logger.removeHandler(old)
            old.close()
        handler: logging.Handler = (
            logging.FileHandler(path, encoding="utf-8") if path else logging.StreamHandler(sys.stderr)
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.addHandler(handler)
        self._window = 0
        self._failures = 0
        self._suppressed = 0

    def record(self, event: str, outcome: str, *, tenant: str = "", peer: str = "", **fields: Any) -> None:
        """One line: `event` (auth, admin, worker, keys), `outcome`, who and from where."""
        line: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "event": event,
            "outcome": outcome,
            "tenant": tenant,
            "peer": peer,
        }
        for key, value in fields.items():
            line[key] = value[:MAX_VALUE_CHARS] if isinstance(value, str) else value
        self.logger.info(json.dumps(line, ensure_ascii=True))

    def failure(self, event: str, outcome: str, *, peer: str = "", **fields: Any) -> None:
        """A refusal: recorded unless this second already has `MAX_FAILURES_PER_S` of them."""
        now = int(time.monotonic())
        if now != self._window:
            self._window, self._failures = now, 0
        self._failures += 1
        if self._failures > MAX_FAILURES_PER_S:
            self._suppressed += 1
            return
        if self._suppressed:
            fields["suppressed"] = self._suppressed
            self._suppressed = 0
        self.record(event, outcome, peer=peer, **fields)

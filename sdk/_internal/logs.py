"""Log set-up shared by the daemons: plain or JSON lines, with job/worker/trace ids when known."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

# `extra=` keys worth showing on every line that has them.
CONTEXT_KEYS = (
    "job_id",
    "tenant",
    "worker_id",
    "trace_id",
    "assignment_id",
    "model",
    "state",
    "reason",
    "error",
    "mode",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(
            {k: getattr(record, k) for k in CONTEXT_KEYS if getattr(record, k, None) not in (None, "")}
        )
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{k}={getattr(record, k)}" for k in CONTEXT_KEYS if getattr(record, k, None) not in (None, "")
        )
        return f"{line} {context}" if context else line


def setup_logging(level: str = "INFO", json_lines: bool = False) -> None:
    """Configure the root logger for a daemon (stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

"""Structured logging for the worker: every line carries the worker id and, inside a job, its ids.

Job and assignment ids live in context variables, so they follow a job from its asyncio task
into the pipeline thread (`asyncio.to_thread` copies the context) without being passed around.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

job_id_var: ContextVar[str] = ContextVar("omnirt_job_id", default="")
assignment_id_var: ContextVar[str] = ContextVar("omnirt_assignment_id", default="")
trace_id_var: ContextVar[str] = ContextVar("omnirt_trace_id", default="")


@contextmanager
def job_context(job_ids: list[str], assignment_id: str, trace_id: str = "") -> Iterator[None]:
    """Tag log lines inside the block with the jobs (comma-joined for a batch) and assignment."""
    tokens = (
        job_id_var.set(",".join(job_ids)),
        assignment_id_var.set(assignment_id),
        trace_id_var.set(trace_id),
    )
    try:
        yield
    finally:
        trace_id_var.reset(tokens[2])
        assignment_id_var.reset(tokens[1])
        job_id_var.reset(tokens[0])


class ContextFilter(logging.Filter):
    """Adds `worker_id`, `job_id`, `assignment_id` and `trace_id` to every record."""

    def __init__(self, worker_id: str) -> None:
        super().__init__()
        self.worker_id = worker_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker_id = self.worker_id
        record.job_id = job_id_var.get()
        record.assignment_id = assignment_id_var.get()
        record.trace_id = trace_id_var.get()
        return True


class TextFormatter(logging.Formatter):
    """`time level logger [job=...] message`; the job tag only inside a job."""

    def format(self, record: logging.LogRecord) -> str:
        job = getattr(record, "job_id", "")
        record.job_tag = f" [job={job}]" if job else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "worker_id": getattr(record, "worker_id", ""),
        }
        for key in ("job_id", "assignment_id", "trace_id"):
            value = getattr(record, key, "")
            if value:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str, json_lines: bool, worker_id: str) -> None:
    """Send every logger's records to stderr with the worker's context."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter(worker_id))
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s%(job_tag)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library chatter (download/progress notices) stays at warnings unless debugging.
    for noisy in ("diffusers", "transformers", "urllib3", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)

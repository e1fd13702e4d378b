"""How a job fails on this worker: the exceptions every room raises and the errors they become.

Every room of the worker raises these (`runtime`, `pipelines`, `export`, the modes), so they
live here, below all of them, rather than in `modes/`: a runtime option or a media input that
refuses a request must not import the execution modes to say so.
"""

from __future__ import annotations

from omnirt import types as t

CANCELLED = "CANCELLED"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


class JobFailure(Exception):
    """A job (or every job of a call) cannot succeed; `error` is what the controller gets."""

    def __init__(self, code: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.error = t.JobError(code=code, message=message, field=field)


class StopRun(Exception):
    """Raised inside a running pipeline (from its step callback) when every job of it must stop."""


class ModelInUse(Exception):
    """`Executor.unload` cannot free a model now: a run or a realtime session still uses it."""


def stop_error(reason: str, where: str) -> t.JobError:
    """The JobError for a job stopped for `reason` (a status code name)."""
    if reason == CANCELLED:
        text = "job cancelled"
    elif reason == DEADLINE_EXCEEDED:
        text = "deadline exceeded"
    elif reason == "UNAVAILABLE":
        text = "the worker stopped the job to shut down (drain timeout)"
    else:
        text = f"job stopped ({reason})"
    return t.JobError(code=reason, message=f"{text} {where}".strip())

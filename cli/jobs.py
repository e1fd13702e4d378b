"""`omnirtctl jobs get | list | watch | wait | cancel`: submitted generations."""

from __future__ import annotations

import argparse
from pathlib import Path

from omnirt.cli.generate import print_finished
from omnirt.cli.output import fmt_ms, fmt_time, print_fields, print_json, print_table
from omnirt.cli.progress import follow, show_progress
from omnirt.client import Client
from omnirt.types import EventKind, Job, JobEvent, JobState


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("jobs", help="submitted generations")
    sub = parser.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)

    get = sub.add_parser("get", parents=[common], help="show one job")
    get.add_argument("job_id")
    get.set_defaults(handler=run_get)

    ls = sub.add_parser("list", parents=[common], help="list jobs, newest first")
    ls.add_argument(
        "--state", dest="states", action="append", choices=[s.value for s in JobState], help="repeatable"
    )
    ls.add_argument("--model", default="", help="only jobs of this model id")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (0: all; default 50)")
    ls.set_defaults(handler=run_list)

    watch = sub.add_parser("watch", parents=[common], help="print a job's events until it ends")
    watch.add_argument("job_id")
    watch.add_argument("--after", type=int, default=0, metavar="SEQUENCE", help="resume after this event")
    watch.set_defaults(handler=run_watch)

    wait = sub.add_parser("wait", parents=[common], help="wait for a job and save its outputs")
    wait.add_argument("job_id")
    wait.add_argument("--out", "-o", type=Path, default=Path("outputs"), help="folder (default: ./outputs)")
    wait.add_argument("--timeout", type=float, metavar="SECONDS", help="give up waiting after this long")
    wait.set_defaults(handler=run_wait)

    cancel = sub.add_parser("cancel", parents=[common], help="cancel a queued or running job")
    cancel.add_argument("job_id")
    cancel.set_defaults(handler=run_cancel)


def job_fields(job: Job) -> list[tuple[str, object]]:
    """The lines of `jobs get`."""
    progress = ""
    if job.progress and job.progress.total_steps:
        progress = f"{job.progress.step}/{job.progress.total_steps} steps"
        progress += f" ({job.progress.stage})" if job.progress.stage else ""
    error = f"{job.error.code}: {job.error.message}" if job.error else ""
    outputs = len(job.result.artifacts) if job.result else None
    return [
        ("id", job.id),
        ("state", job.state),
        ("model", job.model),
        ("task", job.task),
        ("priority", str(job.priority)),
        ("worker", job.worker_id),
        ("attempts", str(job.attempts)),
        ("queue position", str(job.queue_position) if job.queue_position else ""),
        ("waiting", job.waiting_reason),
        ("progress", progress),
        ("error", error),
        ("outputs", outputs),
        ("created", fmt_time(job.created_at)),
        ("started", fmt_time(job.started_at) if job.started_at else ""),
        ("finished", fmt_time(job.finished_at) if job.finished_at else ""),
        ("idempotency key", job.idempotency_key),
        ("labels", job.labels),
    ]


def run_get(args: argparse.Namespace, client: Client) -> int:
    job = client.get_job(args.job_id)
    if args.json:
        print_json(job)
    else:
        print_fields(job_fields(job))
    return 0


def run_list(args: argparse.Namespace, client: Client) -> int:
    jobs = client.list_jobs(args.states, model=args.model, limit=max(args.limit, 0))
    if args.json:
        print_json(jobs)
        return 0
    rows = [(j.id, j.state, j.model, j.task, j.worker_id, fmt_time(j.created_at)) for j in jobs]
    print_table(("ID", "STATE", "MODEL", "TASK", "WORKER", "CREATED"), rows, empty="no jobs")
    return 0


def event_line(event: JobEvent) -> str:
    """One human line per event: `time  #sequence  what happened`."""
    when = event.time.astimezone().strftime("%H:%M:%S.%f")[:-3] if event.time else "-"
    text = event.kind.value
    if event.kind is EventKind.STATE and event.state is not None:
        text = event.state.value
        if event.worker_id:
            text += f" on {event.worker_id}"
        if event.attempt > 1:
            text += f" (attempt {event.attempt})"
        if event.error:
            text += f": {event.error.code}: {event.error.message}"
    elif event.kind is EventKind.PROGRESS and event.progress is not None:
        p = event.progress
        text = f"step {p.step}/{p.total_steps}" + (f" ({p.stage})" if p.stage else "")
    elif event.kind is EventKind.STAGE:
        text = f"{event.stage} " + (
            f"done in {fmt_ms(event.stage_duration_ms)}" if event.stage_finished else "started"
        )
    elif event.kind is EventKind.PREVIEW:
        step = event.progress.step if event.progress else 0
        text = f"preview at step {step} ({event.preview_mime_type}, {len(event.preview)} bytes)"
    elif event.kind is EventKind.LOG:
        text = f"[{event.log_stream or 'log'}] {event.log_text.rstrip()}"
    elif event.kind is EventKind.RESULT and event.result is not None:
        text = f"result: {len(event.result.artifacts)} artifact(s)"
    return f"{when}  #{event.sequence}  {text}"


def run_watch(args: argparse.Namespace, client: Client) -> int:
    for event in client.watch(args.job_id, args.after):
        if args.json:
            print_json(event, compact=True)
        else:
            print(event_line(event), flush=True)
    return 0


def run_wait(args: argparse.Namespace, client: Client) -> int:
    job = client.get_job(args.job_id)
    done = follow(client, job, out=args.out, timeout=args.timeout, bar=show_progress(args.json))
    print_finished(done, json_output=args.json)
    return 0


def run_cancel(args: argparse.Namespace, client: Client) -> int:
    job = client.cancel(args.job_id)
    if args.json:
        print_json(job)
    elif job.cancelled:
        print(f"cancelled job {job.id}")
    else:
        print(f"job {job.id} already {job.state.value}; nothing to cancel")
    return 0

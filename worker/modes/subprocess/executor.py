"""`SubprocessExecutor`: the `subprocess` execution mode, an external command per job.

The catalog entry's `runtime` table names the command and its launcher (see
`omnirt.worker.modes.subprocess.launchers`); the request only supplies data. Per job the worker makes a fresh
job folder (`omnirt.worker.modes.subprocess.job_dir`), writes `request.json` and the inputs, and runs the
command in its own process group (`omnirt.worker.modes.subprocess.child_process`) with

    OMNIRT_JOB_DIR     the job folder
    OMNIRT_REQUEST     its request.json
    OMNIRT_OUTPUT_DIR  where artifacts go
    OMNIRT_JOB_ID, OMNIRT_SEED, OMNIRT_BACKEND

Every stdout/stderr line becomes a LOG event, except the protocol lines on stdout:

    OMNIRT_PROGRESS <step> <total>      -> a PROGRESS event
    OMNIRT_STAGE <name> start|end       -> STAGE events (and a timing in the RunReport)

Exit 0: the files in the output folder are the artifacts. Non-zero exit: INTERNAL with the last
lines of the log. Cancel, the job's deadline and a drain timeout kill the group (CANCELLED,
DEADLINE_EXCEEDED, UNAVAILABLE); so does `runtime.timeout_s`, reported as DEADLINE_EXCEEDED
(the job ran out of the time the model allows; the controller does not retry it, as a rerun
would hit the same limit). The worker never waits on or dies with the child.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt.worker import redact
from omnirt.worker.config import WorkerConfig
from omnirt.worker.failures import DEADLINE_EXCEEDED, JobFailure, stop_error
from omnirt.worker.modes.events import RunRecorder, run_report
from omnirt.worker.modes.executor import CancelFlags, EventSink, Executor, StopCheck
from omnirt.worker.modes.subprocess import child_process, job_dir, launchers
from omnirt.worker.pipelines import media_inputs
from omnirt.worker.runtime import backends

log = logging.getLogger(__name__)

MODE = ExecutionMode.SUBPROCESS
PROGRESS_TAG = "OMNIRT_PROGRESS"
STAGE_TAG = "OMNIRT_STAGE"
RUN_STAGE = "run"


class _LineRouter:
    """Turns the command's lines into PROGRESS / STAGE / LOG events for one job."""

    def __init__(self, recorder: RunRecorder, emit: EventSink, job_id: str, max_log_events: int) -> None:
        self.recorder = recorder
        self.emit = emit
        self.job_id = job_id
        self.max_log_events = max_log_events
        self.log_events = 0
        self.stage_starts: dict[str, float] = {}
        self.current_stage = RUN_STAGE

    def __call__(self, stream: str, line: str) -> None:
        if stream == "stdout" and self._protocol(line.split()):
            return
        self._log(stream, line)

    def _protocol(self, words: list[str]) -> bool:
        if len(words) == 3 and words[0] == PROGRESS_TAG and words[1].isdigit() and words[2].isdigit():
            self.recorder.progress([self.job_id], int(words[1]), int(words[2]), self.current_stage)
            return True
        if len(words) == 3 and words[0] == STAGE_TAG and words[2] in ("start", "end"):
            name = words[1]
            if words[2] == "start":
                self.stage_starts[name] = time.perf_counter()
                self.current_stage = name
                self.recorder.stage_started([self.job_id], name)
            elif name in self.stage_starts:
                self.recorder.stage_finished([self.job_id], name, self.stage_starts.pop(name))
                self.current_stage = next(reversed(self.stage_starts), RUN_STAGE)
            return True
        return False

    def _log(self, stream: str, text: str) -> None:
        self.log_events += 1
        if self.log_events > self.max_log_events + 1:
            return
        if self.log_events == self.max_log_events + 1:
            stream, text = (
                "stderr",
                f"[omnirt] more than {self.max_log_events} log lines; the rest is dropped",
            )
        self.emit(
            t.JobEvent(
                job_id=self.job_id,
                kind=t.EventKind.LOG,
                time=datetime.now(UTC),
                log_stream=stream,
                log_text=text,
            )
        )

    def close_open_stages(self) -> None:
        """End stages the command started but never ended (it exited or was killed)."""
        for name, start in list(self.stage_starts.items()):
            self.recorder.stage_finished([self.job_id], name, start)
        self.stage_starts.clear()


class SubprocessExecutor(Executor):
    """Runs each job as an external command from the catalog, in its own process group."""

    mode = MODE

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.inputs = media_inputs.InputPolicy.of(config)
        self._backend = ""
        self._groups: set[child_process.ProcessGroup] = set()

    @property
    def backend(self) -> str:
        return self._backend or self.config.backend

    async def start(self) -> None:
        # The command picks its own device; the worker only reports (and passes on) the backend.
        if self.config.backend == "cpu":
            self._backend = "cpu"
        else:
            self._backend = await asyncio.to_thread(backends.detect_backend, self.config.backend)

    def search_dirs(self) -> list[Path]:
        """Where relative script paths are looked up: `--script-dirs`, then OmniRT's examples."""
        dirs = [Path(d).expanduser() for d in self.config.script_dirs]
        examples = launchers.examples_dir()
        return [*dirs, examples] if examples.is_dir() else dirs

    def jobs_root(self, settings: launchers.SubprocessSettings) -> Path:
        """`runtime.job_dir`, else `jobs/` beside the model folder."""
        if settings.job_dir:
            return Path(settings.job_dir).expanduser()
        return Path(self.config.model_dir).parent / "jobs"

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        recorder = RunRecorder(emit)
        stop = StopCheck(flags, assignment)
        for item in assignment.items:
            recorder.running(item.job_id, self.config.worker_id, item.attempt)
        outcomes = []
        for item in assignment.items:  # one process per job, one after the other
            try:
                outcomes.append(await self._run_item(assignment, item, recorder, emit, stop))
            except JobFailure as failure:
                outcomes.append(ItemOutcome(item.job_id, error=failure.error))
            except Exception as exc:  # a bug here costs the job, never the worker
                log.exception("job %s failed", item.job_id)
                error = t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}")
                outcomes.append(ItemOutcome(item.job_id, error=error))
        return [self._public(outcome) for outcome in outcomes]

    def _public(self, outcome: ItemOutcome) -> ItemOutcome:
        """`outcome` with no worker path in its error (job folders, script dirs); logged in full."""
        if outcome.error is None:
            return outcome
        error = redact.public_error(outcome.error, {self.config.model_dir: "MODEL_DIR"})
        if error is not outcome.error:
            log.info("job %s: %s", outcome.job_id, outcome.error.message)
        return dataclasses.replace(outcome, error=error)

    async def close(self) -> None:
        for group in list(self._groups):
            group.kill_now()

    # ---- one job -------------------------------------------------------------------------

    async def _run_item(
        self,
        assignment: Assignment,
        item: AssignmentItem,
        recorder: RunRecorder,
        emit: EventSink,
        stop: StopCheck,
    ) -> ItemOutcome:
        job_id, request = item.job_id, item.request
        reason = stop.reason(job_id)
        if reason:
            return ItemOutcome(job_id, error=stop_error(reason, "before start"))
        settings = launchers.parse_settings(assignment.model.runtime)
        launchers.check_extras(request.extra)
        folder = await asyncio.to_thread(job_dir.create, self.jobs_root(settings), job_id)
        try:
            command = launchers.resolve_command(settings, self.search_dirs(), folder)
            request_path = await asyncio.to_thread(self._prepare, folder, assignment.model, item, settings)
            env = self._environment(settings, folder, request_path, item)
            router = _LineRouter(recorder, emit, job_id, settings.max_log_events)
            run_start = time.perf_counter()
            recorder.stage_started([job_id], RUN_STAGE)
            try:
                outcome = await child_process.run_command(
                    command.argv,
                    env=env,
                    cwd=command.cwd,
                    on_line=router,
                    should_stop=lambda: stop.reason(job_id),
                    timeout_s=settings.timeout_s,
                    kill_grace_s=settings.kill_grace_s,
                    on_start=self._groups.add,
                    marker=f"OMNIRT_JOB_DIR={folder}",
                )
            except child_process.LaunchError as exc:
                raise JobFailure("FAILED_PRECONDITION", str(exc)) from None
            finally:
                self._groups = {g for g in self._groups if g.proc.returncode is None}
            router.close_open_stages()
            recorder.stage_finished([job_id], RUN_STAGE, run_start)
            error = self._error(outcome, settings)
            if error is not None:
                return ItemOutcome(job_id, error=error)
            return await self._result(assignment, item, recorder, folder, command, settings, outcome)
        finally:
            if not settings.keep_job_dir:
                await asyncio.to_thread(job_dir.remove, folder)

    def _prepare(
        self, folder: Path, spec: t.ModelSpec, item: AssignmentItem, settings: launchers.SubprocessSettings
    ) -> Path:
        # URIs are read here, under the worker's input roots; the job folder gets bytes only.
        request = media_inputs.with_uris_read(item.request, self.inputs.for_model(spec))
        inputs = job_dir.write_inputs(folder, request, settings.input_formats)
        document = job_dir.request_document(item.job_id, spec, request, inputs, folder / job_dir.OUTPUTS)
        return job_dir.write_request(folder, document)

    def _environment(
        self, settings: launchers.SubprocessSettings, folder: Path, request_path: Path, item: AssignmentItem
    ) -> dict[str, str]:
        env = {**os.environ, **settings.env}
        env.update(
            OMNIRT_JOB_DIR=str(folder),
            OMNIRT_REQUEST=str(request_path),
            OMNIRT_OUTPUT_DIR=str(folder / job_dir.OUTPUTS),
            OMNIRT_JOB_ID=item.job_id,
            OMNIRT_SEED=str(item.request.seed if item.request.seed is not None else 0),
            OMNIRT_BACKEND=self.backend,
            PYTHONUNBUFFERED="1",  # progress lines must arrive as they are printed
        )
        return env

    def _error(
        self, outcome: child_process.ProcessOutcome, settings: launchers.SubprocessSettings
    ) -> t.JobError | None:
        if outcome.stop_reason == child_process.TIMEOUT:
            return t.JobError(
                DEADLINE_EXCEEDED,
                f"the command ran longer than the model's runtime.timeout_s ({settings.timeout_s:g} s) "
                "and was killed",
            )
        if outcome.stop_reason is not None:
            return stop_error(outcome.stop_reason, "while running (the command was killed)")
        if outcome.returncode != 0:
            code = outcome.returncode or 0
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            tail = "\n".join(outcome.tail) or "(no output)"
            return t.JobError("INTERNAL", f"the command {how}; last lines of its log:\n{tail}")
        return None

    async def _result(
        self,
        assignment: Assignment,
        item: AssignmentItem,
        recorder: RunRecorder,
        folder: Path,
        command: launchers.ResolvedCommand,
        settings: launchers.SubprocessSettings,
        outcome: child_process.ProcessOutcome,
    ) -> ItemOutcome:
        job_id, request = item.job_id, item.request
        seed = request.seed or 0
        export_start = time.perf_counter()
        recorder.stage_started([job_id], "export")
        artifacts = await asyncio.to_thread(job_dir.collect_artifacts, folder / job_dir.OUTPUTS, job_id, seed)
        recorder.stage_finished([job_id], "export", export_start)
        if not artifacts:
            tail = "\n".join(outcome.tail) or "(no output)"
            return ItemOutcome(
                job_id,
                error=t.JobError(
                    "INTERNAL",
                    "the command exited 0 but wrote no artifact (png, jpg, webp, mp4, gif or wav) "
                    f"into OMNIRT_OUTPUT_DIR; last lines of its log:\n{tail}",
                ),
            )
        report = run_report(
            assignment,
            item,
            recorder,
            worker_id=self.config.worker_id,
            execution_mode=MODE,
            backend=self.backend,
            device=backends.DEVICES.get(self.backend, self.backend),
            seeds=[seed],
            peak_memory_bytes=outcome.peak_rss_bytes,
            config_resolved=self._config(request, assignment.model, command, settings),
        )
        return ItemOutcome(job_id, result=t.GenerateResult(job_id=job_id, artifacts=artifacts, report=report))

    @staticmethod
    def _config(
        request: t.GenerateRequest,
        spec: t.ModelSpec,
        command: launchers.ResolvedCommand,
        settings: launchers.SubprocessSettings,
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            name: getattr(request, name)
            for name in ("width", "height", "num_frames", "fps", "num_inference_steps", "guidance_scale")
            if getattr(request, name) is not None
        }
        config.update(
            seed=request.seed,
            output_format=request.output_format,
            source=spec.source,
            launcher=settings.launcher,
            command=command.target,
            timeout_s=settings.timeout_s,
        )
        if request.extra:
            config["extra"] = request.extra
        return config

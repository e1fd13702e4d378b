"""The program torchrun starts on every rank of a resident process group.

`python -m torch.distributed.run --nproc-per-node N ... -m omnirt.worker.modes.persistent.rank
--socket PATH --source DIR ...`: every rank initialises `torch.distributed` and loads the
pipeline once; rank 0 then connects to the worker daemon's socket (see `channel`), says
`ready`, and serves requests one at a time: it broadcasts each request to the other ranks
(`broadcast_object_list`), every rank runs `cfg_denoise` (one job, guidance split across
ranks), `data_parallel` (a batch, split across ranks) or `pipeline_call` (any family through
its own `__call__`, shared by `runtime.parallel`), and after each step rank 0 reports
progress, waits for the daemon's continue/stop answer and broadcasts it, so all ranks stop at
the same step. Rank 0 decodes (or gathers) and returns the images. A streaming model (a
`TalkingHeadPipeline`) takes the session ops instead (`streaming`: every rank denoises each
chunk, the decode of its frames is split and gathered on rank 0).

The pipeline program's step agreement is one int broadcast from rank 0 per step (CONTINUE or
STOP) and one after rank 0's call (DONE, or FAILED when its call raised); a rank without a
share of the batch, or whose call ended first, receives until it sees one that is not
CONTINUE, so every rank takes part in every broadcast whatever its share. An error raised on
every rank alike before the first collective (the pipeline's own argument checks) is reported
and the group keeps serving; one raised on a single rank while the others wait in a collective
of the guidance split leaves the group hung until the daemon's step timeout restarts it.

A rank exits when its parent (the torchrun agent) dies, when rank 0 loses the daemon, or on a
collective error (a peer died); the daemon then restarts the whole group.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from omnirt.worker.modes.persistent import channel
from omnirt.worker.modes.persistent.settings import STREAMING_CLASSES

# No collective may time out while the group waits for the next request (a rank blocks in
# the request broadcast while idle); hung peers are the daemon's concern (step timeout).
_IDLE_TIMEOUT = datetime.timedelta(days=365)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when its parent exits (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omnirt.worker.modes.persistent.rank")
    parser.add_argument("--socket", required=True, help="the daemon's Unix socket (rank 0 connects)")
    parser.add_argument("--source", required=True, help="local model folder for from_pretrained")
    parser.add_argument("--pipeline-class", default="StableDiffusionPipeline")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or npu (one device per local rank)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--dist-backend", default="gloo", help="gloo, nccl or hccl")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0 = default)")
    parser.add_argument(
        "--context-parallel", default="", help="ulysses or ring: the denoiser's sequence split"
    )
    parser.add_argument(
        "--attention-backend", default="", help="a diffusers attention backend for the denoiser"
    )
    return parser.parse_args(argv)


def _device(kind: str, local_rank: int) -> str:
    import torch

    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    if kind == "npu":
        import torch_npu  # registers the npu device and hccl; `torch.npu` is its `npu` module

        torch_npu.npu.set_device(local_rank)
        return f"npu:{local_rank}"
    return "cpu"


def _load(args: argparse.Namespace, device: str) -> Any:
    import diffusers
    import torch
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from omnirt.worker.pipelines.loader import dtype_argument

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    if args.pipeline_class in STREAMING_CLASSES:
        from omnirt.worker.modes.persistent import streaming

        return streaming.load(args.source, device, args.dtype)
    cls = getattr(diffusers, args.pipeline_class)
    pipe = cls.from_pretrained(args.source, **{dtype_argument(): getattr(torch, args.dtype)})
    if device != "cpu":
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    if args.context_parallel or args.attention_backend:
        from omnirt.worker.modes.persistent import context_parallel

        context_parallel.apply(pipe, args.context_parallel, args.attention_backend)
    return pipe


# The pipeline program's step flags (`Rank._flag`).
CONTINUE, STOP, DONE, FAILED = 0, 1, 2, 3


class _Ended(Exception):
    """Rank 0 ended the call (a stop, or its own call failed): raised in the step callback."""

    def __init__(self, flag: int) -> None:
        super().__init__(flag)
        self.flag = flag


def _error(exc: BaseException) -> dict[str, str]:
    from omnirt.worker.failures import JobFailure

    if isinstance(exc, JobFailure):
        return {"code": exc.error.code, "message": exc.error.message, "field": exc.error.field}
    return {
        "code": "INTERNAL",
        "message": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}",
        "field": "",
    }


class Rank:
    """One rank's state: the loaded pipeline, its place in the group, rank 0's channel."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.sock: socket.socket | None = None
        self.pipe: Any = None
        self.device = "cpu"
        self.streaming: Any = None  # the streaming program's sessions, made on the first session op

    # ---- start ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Init the group, load the model on every rank; rank 0 reports to the daemon."""
        import torch
        import torch.distributed as dist

        if self.args.threads > 0:
            torch.set_num_threads(self.args.threads)
        started = time.perf_counter()
        self.device = _device(self.args.device, self.local_rank)
        dist.init_process_group(backend=self.args.dist_backend, timeout=_IDLE_TIMEOUT)
        init_ms = (time.perf_counter() - started) * 1000.0
        error = ""
        loaded = time.perf_counter()
        try:
            self.pipe = _load(self.args, self.device)
        except Exception as exc:
            error = f"rank {self.rank}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
        model_ms = (time.perf_counter() - loaded) * 1000.0
        facts: list[Any] = [None] * self.world_size
        dist.all_gather_object(facts, {"pid": os.getpid(), "error": error})
        errors = [f["error"] for f in facts if f["error"]]
        if self.rank == 0:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(self.args.socket)
            if errors:
                channel.send(self.sock, {"type": "failed", "message": "; ".join(errors)})
            else:
                channel.send(
                    self.sock,
                    {
                        "type": "ready",
                        "world_size": self.world_size,
                        "pids": [f["pid"] for f in facts],
                        "init_ms": init_ms,
                        "model_ms": model_ms,
                        "pipeline_class": type(self.pipe).__name__,
                        "device": self.device,
                    },
                )
        return not errors

    # ---- serving -------------------------------------------------------------------------

    def _next_request(self) -> dict[str, Any]:
        import torch.distributed as dist

        message: dict[str, Any] = {"op": "shutdown"}
        if self.rank == 0:
            assert self.sock is not None
            try:
                message = channel.receive(self.sock)
            except channel.ChannelClosed:
                message = {"op": "shutdown"}  # the daemon is gone: take the group down
        box = [message]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _agree(self, value: bool) -> bool:
        """Rank 0's `value` on every rank."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if value else 0], dtype=torch.int32, device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _on_step(self, step: int, total: int) -> bool:
        stop = False
        if self.rank == 0:
            assert self.sock is not None
            channel.send(self.sock, {"type": "progress", "step": step, "total": total})
            stop = channel.receive(self.sock).get("op") == "stop"
        return self._agree(stop)

    def _prepare_agreed(self, prepare: Any) -> tuple[Any, dict[str, Any] | None]:
        """`prepare()` on every rank, then the first rank's error (if any) on every rank.

        Preparation errors (bad size, unknown scheduler) are agreed on before any step, so no
        rank is left waiting in a collective; errors inside the loop end the group.
        """
        import torch.distributed as dist

        from omnirt.worker.modes.persistent.cfg_denoise import JobRejected

        error: dict[str, Any] | None = None
        prep = None
        try:
            prep = prepare()
        except JobRejected as exc:
            error = {"type": "error", "code": "INVALID_ARGUMENT", "message": str(exc), "field": exc.field}
        except Exception as exc:
            error = {
                "type": "error",
                "code": "INTERNAL",
                "message": f"{type(exc).__name__}: {exc}",
                "field": "",
            }
        errors: list[Any] = [None] * self.world_size
        dist.all_gather_object(errors, error)
        return prep, next((e for e in errors if e), None)

    def run_batch(self, jobs_fields: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A batch split across the ranks (data parallel); rank 0 returns the message for the daemon."""
        import torch.distributed as dist

        from omnirt.worker.modes.persistent import cfg_denoise as cfg
        from omnirt.worker.modes.persistent import data_parallel as dp
        from omnirt.worker.runtime.backends import PeakMemory

        jobs = [cfg.TextJob(**fields) for fields in jobs_fields]
        memory = PeakMemory(self.device)
        memory.reset()
        outputs = dp.outputs_of(jobs)
        share = dp.share_of(outputs, self.rank, self.world_size)
        prep, error = self._prepare_agreed(lambda: dp.prepare(self.pipe, jobs, share, self.device))
        if error is not None or prep is None:
            return error
        made = dp.generate_share(self.pipe, jobs, prep, self._on_step)
        if made is None:
            return {"type": "stopped"}
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(made, gathered, dst=0)
        if self.rank != 0:
            return None
        assert gathered is not None
        images: list[list[Any]] = [[None] * len(job.seeds) for job in jobs]
        for (j, k), image in (pair for part in gathered for pair in part):
            images[j][k] = image
        first = images[0][0]
        return {
            "type": "result",
            "images": images,
            "scheduler": type(prep.scheduler).__name__,
            "num_inference_steps": len(prep.timesteps),
            "width": int(first.shape[1]),
            "height": int(first.shape[0]),
            "peak_memory_bytes": memory.peak_bytes(),
            "outputs_per_rank": [len(part) for part in gathered],
        }

    def _flag(self, value: int) -> int:
        """Rank 0's step flag on every rank."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([value], dtype=torch.int32, device=self.device)
        dist.broadcast(flag, src=0)
        return int(flag.item())

    def _step_flag(self, step: int, total: int, previews: list[Any] | None = None) -> int:
        value = CONTINUE
        if self.rank == 0:
            assert self.sock is not None
            message = {"type": "progress", "step": step, "total": total, "previews": previews or []}
            channel.send(self.sock, message)
            value = STOP if channel.receive(self.sock).get("op") == "stop" else CONTINUE
        return self._flag(value)

    def run_call(self, call: dict[str, Any]) -> dict[str, Any] | None:
        """A batch of the pipeline program (`pipeline_call`); rank 0 returns the message for the daemon."""
        import torch.distributed as dist

        from omnirt.worker.modes.persistent import pipeline_call as pc
        from omnirt.worker.modes.persistent.context_parallel import SequenceProbe
        from omnirt.worker.modes.persistent.guidance_split import GuidanceSplit
        from omnirt.worker.runtime.backends import PeakMemory

        plans, parallel, spec = call["plans"], str(call["parallel"]), call["model"]
        memory = PeakMemory(self.device)
        memory.reset()
        refused, error = self._prepare_agreed(lambda: pc.check_plans(self.pipe, plans, spec))
        if error is not None or refused is None:
            return error
        box = [{i: dataclasses.asdict(e) for i, e in refused.items()}]
        dist.broadcast_object_list(box, src=0)  # rank 0's verdicts (every rank's are the same)
        errors: dict[int, dict[str, str]] = box[0]
        outputs = pc.outputs_of(plans, [i for i in range(len(plans)) if i not in errors])
        share = pc.share_of(parallel, outputs, self.rank, self.world_size)
        split = GuidanceSplit(self.rank, self.world_size, len(outputs)) if parallel == "cfg" else None
        probe = SequenceProbe() if parallel in ("ulysses", "ring") else None
        planned = int(plans[0].common.get("num_inference_steps", 0))
        steps: list[int] = []
        previews = pc.preview_maker(call.get("preview"), spec, plans) if self.rank == 0 and share else None

        def step_end(pipe: Any, index: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            if split is not None:
                split.step_ended()
            total = int(getattr(pipe, "num_timesteps", None) or planned or index + 1)
            steps[:] = [total]
            made = []
            if previews is not None and previews.due(index + 1, total):
                made = pc.previews_of(previews, pipe, tensors.get("latents"), share)
            flag = self._step_flag(index + 1, total, made)
            if flag != CONTINUE:
                raise _Ended(flag)
            return tensors

        ended: int | None = None
        made: list[Any] = []
        info: dict[str, Any] = {}
        failure: dict[str, str] | None = None
        if share:
            decode = self.rank == 0 or parallel not in pc.EVERY_RANK
            try:
                with probe.installed(self.pipe) if probe is not None else contextlib.nullcontext():
                    made, info = pc.run_share(
                        self.pipe, plans, spec, share, self.device, step_end, split, decode
                    )
            except _Ended as exc:
                ended = exc.flag
            except Exception as exc:
                traceback.print_exc()
                failure = _error(exc)
        if self.rank == 0 and ended is None:
            ended = self._flag(FAILED if failure else DONE)
        while ended is None or ended == CONTINUE:  # no share, or done first: follow rank 0's flags
            ended = self._flag(CONTINUE)
        mine = {
            "outputs": list(zip(share, made, strict=True)) if made else [],
            "failure": failure,
            "split": split.stats() if split is not None else None,
            "sequence": probe.stats() if probe is not None else None,
            "info": info,
            "made": len(share),
        }
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank != 0:
            return None
        assert gathered is not None
        if ended == STOP:
            return {"type": "stopped"}
        return self._call_reply(plans, errors, gathered, steps, memory.peak_bytes(), parallel)

    def _call_reply(
        self,
        plans: list[Any],
        errors: dict[int, dict[str, str]],
        gathered: list[dict[str, Any]],
        steps: list[int],
        peak: int,
        parallel: str,
    ) -> dict[str, Any]:
        failure = next((part["failure"] for part in gathered if part["failure"]), None)
        per_plan: list[list[Any] | None] = [
            None if i in errors else [None] * plan.num_outputs for i, plan in enumerate(plans)
        ]
        for part in gathered:
            for (j, k), output in part["outputs"]:
                slot = per_plan[j]
                assert slot is not None
                slot[k] = output
        for i, slot in enumerate(per_plan):
            if slot is not None and (failure or any(o is None for o in slot)):
                errors[i] = failure or {"code": "INTERNAL", "message": "a rank made no output", "field": ""}
                per_plan[i] = None
        from omnirt.worker.modes.persistent import pipeline_call as pc
        from omnirt.worker.modes.persistent.inputs import without_media

        info = gathered[0]["info"]
        reply: dict[str, Any] = {
            "type": "result",
            "outputs": per_plan,
            "errors": errors,
            "specific": [without_media(plan.specific) for plan in plans],  # no decoded images back
            "scheduler": info.get("scheduler", ""),
            "num_inference_steps": steps[0] if steps else int(plans[0].common.get("num_inference_steps", 0)),
            "pipeline_class": info.get("pipeline_class", type(self.pipe).__name__),
            "warnings": info.get("warnings", []),
            "peak_memory_bytes": peak,
            "parallel": parallel,
            "split": [part["split"] for part in gathered] if gathered[0]["split"] is not None else [],
            "sequence": [part["sequence"] for part in gathered if part["sequence"] is not None],
        }
        if parallel not in pc.EVERY_RANK:  # the outputs were cut between the ranks
            reply["outputs_per_rank"] = [part["made"] for part in gathered]
        return reply

    def run_job(self, job_fields: dict[str, Any]) -> dict[str, Any] | None:
        """One request on this rank; rank 0 returns the message for the daemon."""
        import torch.distributed as dist

        from omnirt.worker.modes.persistent import cfg_denoise as cfg
        from omnirt.worker.runtime.backends import PeakMemory

        job = cfg.TextJob(**job_fields)
        memory = PeakMemory(self.device)
        memory.reset()
        prep, error = self._prepare_agreed(lambda: cfg.prepare(self.pipe, job, self.device))
        if error is not None or prep is None:
            return error
        group = cfg.Group(self.rank, self.world_size, lambda tensor, src: dist.broadcast(tensor, src))
        started = time.perf_counter()
        latents = cfg.denoise(self.pipe, job, prep, group, self._on_step)
        if latents is None:
            return {"type": "stopped"}
        if self.rank != 0:
            return None
        denoised = time.perf_counter()
        images = cfg.decode(self.pipe, latents, prep.generators)
        return {
            "type": "result",
            "images": images,
            "scheduler": type(prep.scheduler).__name__,
            "num_inference_steps": len(prep.timesteps),
            "width": int(images[0].shape[1]),
            "height": int(images[0].shape[0]),
            "denoise_ms": (denoised - started) * 1000.0,
            "decode_ms": (time.perf_counter() - denoised) * 1000.0,
            "peak_memory_bytes": memory.peak_bytes(),
            "cfg_parallel": prep.uncond is not None and self.world_size > 1,
        }

    def streaming_program(self) -> Any:
        """This rank's `streaming.StreamingProgram` (its open sessions)."""
        if self.streaming is None:
            from omnirt.worker.modes.persistent.streaming import StreamingProgram

            self.streaming = StreamingProgram(self.pipe, self.rank, self.world_size, self.device)
        return self.streaming

    def serve(self) -> None:
        """Requests until shutdown."""
        while True:
            message = self._next_request()
            op = message.get("op")
            if op in channel.SESSION_OPS:  # the streaming program (a talking head)
                reply = self.streaming_program().handle(message)
            elif op != "run":
                return
            # "call": the pipeline program; "jobs": a batch for the SD data-parallel loop; "job":
            # one job of the SD loop with guidance split.
            elif "call" in message:
                reply = self.run_call(message["call"])
            elif "jobs" in message:
                reply = self.run_batch(message["jobs"])
            else:
                reply = self.run_job(message["job"])
            if self.rank == 0 and reply is not None:
                assert self.sock is not None
                channel.send(self.sock, reply)


def main(argv: list[str] | None = None) -> int:
    """Entry point of every rank."""
    die_with_parent()
    args = _parse(argv)
    rank = Rank(args)
    try:
        if not rank.start():
            return 3
        rank.serve()
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

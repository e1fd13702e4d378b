"""Per-model options of the `persistent_worker` mode, read from the catalog entry's `runtime`.

```toml
[models.runtime]
nproc_per_node = 2          # ranks in the group (one device each on cuda/ascend)
idle_unload_s = 600         # stop the group after this long without a request (0 = never)
start_timeout_s = 600       # group start (spawn + dist init + model load) must finish in this
step_timeout_s = 300        # longest silence of rank 0 during a job before the group is restarted
restart_backoff_s = 1       # first restart delay after a crash, doubling per crash ...
restart_backoff_max_s = 60  # ... up to this
dist_backend = ""           # gloo / nccl / hccl; empty = by backend (cpu gloo, cuda nccl, ascend hccl)
program = "cfg_parallel"    # the Stable Diffusion loops: cfg_parallel (one job at a time, guidance
                            # split across 2 ranks) or data_parallel (a batch's outputs split);
                            # "pipeline" = any family through its own __call__ (see `parallel`)
parallel = "cfg"            # implies program "pipeline"; how the ranks share a call: cfg (guidance
                            # split across 2 ranks), data (a batch's outputs split), none (rank 0
                            # alone), ulysses / ring (context parallel: the sequence split)
attention_backend = ""      # a diffusers attention backend for the denoiser (ring needs one that
                            # returns the log-sum-exp: flash, sage, _native_cudnn)
```

A streaming model's pipeline class picks its program (`STREAMING_CLASSES`: a
`TalkingHeadPipeline` runs "talking_head", realtime sessions, `streaming`); `program` may then
only name that program, and `parallel` must be unset.

Values travel through `google.protobuf.Struct`, so integers arrive as floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "ascend": "hccl"}
PROGRAMS = ("cfg_parallel", "data_parallel", "pipeline")
# Streaming models: pipeline class -> the program that serves its realtime sessions.
STREAMING_CLASSES = {"TalkingHeadPipeline": "talking_head"}
# The "pipeline" program's ways of sharing one call (`pipeline_call`).
PARALLEL_KINDS = ("cfg", "data", "none", "ulysses", "ring")
# Context parallel (diffusers' `ContextParallelConfig`): set on the denoiser when it is loaded.
CONTEXT_KINDS = ("ulysses", "ring")


class SettingsError(ValueError):
    """A runtime option is malformed (the job fails with FAILED_PRECONDITION naming it)."""


def _number(runtime: Mapping[str, Any], key: str, default: float, minimum: float) -> float:
    value = runtime.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(f"runtime.{key} must be a number, not {value!r}")
    if value < minimum:
        raise SettingsError(f"runtime.{key} must be at least {minimum:g}, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class GroupSettings:
    """How one model's resident process group is run."""

    nproc_per_node: int = 1
    idle_unload_s: float = 0.0
    start_timeout_s: float = 600.0
    step_timeout_s: float = 300.0
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 60.0
    dist_backend: str = "gloo"
    program: str = "cfg_parallel"
    parallel: str = ""  # the "pipeline" program's kind; "" for the Stable Diffusion loops
    attention_backend: str = ""

    @property
    def context_parallel(self) -> str:
        """ "ulysses" or "ring" when the denoiser is loaded context parallel, else ""."""
        return self.parallel if self.parallel in CONTEXT_KINDS else ""

    @property
    def batches(self) -> bool:
        """Whether the compatible jobs of an assignment go to the group as one request."""
        return self.program == "pipeline" or self.program == "data_parallel"

    @property
    def streaming(self) -> bool:
        """Whether the group serves realtime sessions (and no jobs)."""
        return self.program in STREAMING_CLASSES.values()

    @classmethod
    def from_runtime(
        cls, runtime: Mapping[str, Any], backend: str, pipeline_class: str = ""
    ) -> GroupSettings:
        """Settings from a model's `runtime` table on the worker's resolved `backend`."""
        nproc = _number(runtime, "nproc_per_node", 1, 1)
        if not nproc.is_integer():
            raise SettingsError(f"runtime.nproc_per_node must be an integer, not {nproc:g}")
        dist_backend = str(runtime.get("dist_backend", "") or DIST_BACKENDS.get(backend, "gloo"))
        if dist_backend not in ("gloo", "nccl", "hccl", "mpi"):
            raise SettingsError(f"runtime.dist_backend {dist_backend!r} is not gloo, nccl, hccl or mpi")
        program, parallel = _program(runtime, pipeline_class)
        if parallel == "ring" and dist_backend == "gloo":
            # diffusers' ring attention merges partial results by their log-sum-exp, which
            # PyTorch's native attention (the only backend on cpu) does not return.
            raise SettingsError(
                "runtime.parallel 'ring' cannot run on gloo (cpu): ring attention needs an attention "
                "backend that returns the log-sum-exp (flash, sage, _native_cudnn), which exist on "
                "CUDA with nccl only; use 'ulysses' (runs on gloo) or 'cfg'"
            )
        if parallel in CONTEXT_KINDS and nproc < 2:
            raise SettingsError(f"runtime.parallel {parallel!r} needs runtime.nproc_per_node of at least 2")
        return cls(
            nproc_per_node=int(nproc),
            idle_unload_s=_number(runtime, "idle_unload_s", 0.0, 0.0),
            start_timeout_s=_number(runtime, "start_timeout_s", 600.0, 1.0),
            step_timeout_s=_number(runtime, "step_timeout_s", 300.0, 1.0),
            restart_backoff_s=_number(runtime, "restart_backoff_s", 1.0, 0.0),
            restart_backoff_max_s=_number(runtime, "restart_backoff_max_s", 60.0, 0.0),
            dist_backend=dist_backend,
            program=program,
            parallel=parallel,
            attention_backend=str(runtime.get("attention_backend", "") or ""),
        )


def _program(runtime: Mapping[str, Any], pipeline_class: str = "") -> tuple[str, str]:
    """(program, parallel) from `runtime.program` and `runtime.parallel`: `parallel` implies the
    "pipeline" program (cfg when only the program is named); the Stable Diffusion loops take none;
    a streaming pipeline class its own program."""
    program = str(runtime.get("program", "") or "")
    parallel = str(runtime.get("parallel", "") or "")
    streaming = STREAMING_CLASSES.get(pipeline_class)
    if streaming is not None:
        if program not in ("", streaming) or parallel:
            raise SettingsError(
                f"runtime.{'parallel' if parallel else 'program'} does not apply to a {pipeline_class}: "
                f"it runs the {streaming!r} program (leave runtime.program and runtime.parallel unset)"
            )
        return streaming, ""
    if program in STREAMING_CLASSES.values():
        raise SettingsError(f"runtime.program {program!r} is for {', '.join(STREAMING_CLASSES)} models only")
    if program and program not in PROGRAMS:
        raise SettingsError(f"runtime.program {program!r} is not {', '.join(PROGRAMS)}")
    if parallel and parallel not in PARALLEL_KINDS:
        raise SettingsError(f"runtime.parallel {parallel!r} is not {', '.join(PARALLEL_KINDS)}")
    if parallel and program not in ("", "pipeline"):
        raise SettingsError(
            f"runtime.parallel is for the pipeline program; runtime.program {program!r} is the Stable "
            "Diffusion loop: set one of them"
        )
    if parallel or program == "pipeline":
        return "pipeline", parallel or "cfg"
    return program or PROGRAMS[0], ""

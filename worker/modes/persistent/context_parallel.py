"""Context parallel on the ranks: the denoiser's sequence split across them (diffusers' own).

`runtime.parallel = "ulysses"` or `"ring"` calls `enable_parallelism(config=ContextParallelConfig(
ulysses_degree=N))` (or `ring_degree=N`) on the pipeline's denoisers when the group loads the
model (N = the group's ranks). Every rank then runs the same call: diffusers cuts the tokens
into N parts at the model's entry, each rank attends its part (Ulysses: an all-to-all trades
sequence parts for heads; Ring: key/value parts go round) and the output is gathered at the
exit, so every rank holds the whole result.

What diffusers 0.42.1 needs, found on this worker's CPU group:
- a transformer with a context-parallel plan (`_cp_plan`): Flux, Flux.2, Wan (2.1, 2.2),
  Qwen-Image, LTX-Video, LTX-2, ChronoEdit, Helios, MiniMax; any other is refused at load;
- `ulysses_anything` / `ring_anything`, set here, so that any token and head count splits
  (without it Qwen-Image's 64x64 request fails: its sequence is not a multiple of 2);
- an accelerator count: diffusers picks the rank's device as `rank % torch.accelerator.device_count()`,
  a division by zero on a machine without one. That device is only recorded (the mesh is
  built on the default device type, cpu there), so on such a machine the call is made with
  a count of 1;
- Ulysses runs on gloo (its all-to-all exists there, uneven splits included): tested on CPU
  with Wan (the same frames as one process, to the bit), Wan 2.2, Flux, Flux.2 and Qwen-Image
  (within float rounding). Tiny LTX-Video fails inside diffusers' split (a size mismatch, 2
  against 4, also in a plain torchrun script without OmniRT): its jobs fail INTERNAL on every
  rank alike and the group keeps serving; untried on a real LTX-Video.
- Ring merges its partial attentions by their log-sum-exp, which PyTorch's
  native attention (the only backend on CPU) does not return: it needs flash, sage or
  `_native_cudnn` attention (`runtime.attention_backend`), which exist on CUDA only; the
  settings refuse ring on gloo (`runtime.parallel`, FAILED_PRECONDITION).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from omnirt.worker.modes.persistent.guidance_split import denoisers


class ContextParallelError(Exception):
    """The model cannot be loaded context parallel (the group fails to start, FAILED_PRECONDITION)."""


def apply(pipe: Any, kind: str, attention_backend: str = "") -> None:
    """Set `attention_backend` on the denoisers, then make them context parallel (`kind`) over
    the whole process group; ContextParallelError when a denoiser cannot be."""
    import torch
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    models: list[Any] = denoisers(pipe)  # diffusers ModelMixins (typed as plain modules there)
    if not models:
        raise ContextParallelError(f"{type(pipe).__name__} has no transformer or unet to split")
    for model in models:
        if attention_backend:
            model.set_attention_backend(attention_backend)
    if not kind:
        return
    world = dist.get_world_size()
    for model in models:
        name = type(model).__name__
        if getattr(model, "_cp_plan", None) is None:
            raise ContextParallelError(
                f"runtime.parallel {kind!r}: {name} has no context-parallel plan in diffusers (Flux, "
                "Flux.2, Wan, Qwen-Image, LTX-Video, LTX-2 and ChronoEdit have one); use 'cfg' or 'data'"
            )
        # The "anything" modes take any token count (a text of odd length, any size) and, for
        # Ulysses, any head count: Qwen-Image's 64x64 request has a sequence that 2 does not divide.
        config = (
            ContextParallelConfig(ulysses_degree=world, ulysses_anything=True)
            if kind == "ulysses"
            else ContextParallelConfig(ring_degree=world, ring_anything=True)
        )
        counted = (
            contextlib.nullcontext()
            if torch.accelerator.device_count() > 0
            else mock.patch.object(torch.accelerator, "device_count", return_value=1)
        )
        with counted:
            model.enable_parallelism(config=config)


class SequenceProbe:
    """The tokens this rank's attention took in one call: the largest sequence (`hidden_states`'
    second dimension) an attention module of the denoisers was given. Context parallel splits the
    sequence before the first block, so each rank's count is its share (Wan's 48 tokens: 24 on
    each of 2 ranks); a model the split missed shows the whole. For the report
    (`config_resolved["context_parallel"]`), read by a shape per attention call."""

    def __init__(self) -> None:
        self.tokens = 0

    def _seen(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        states: Any = args[0] if args else kwargs.get("hidden_states")
        if getattr(states, "ndim", 0) == 3:  # [batch, tokens, channels]
            self.tokens = max(self.tokens, int(states.shape[1]))

    def stats(self) -> dict[str, Any]:
        """This rank's share of the sequence."""
        return {"tokens": self.tokens}

    @contextlib.contextmanager
    def installed(self, pipe: Any) -> Iterator[None]:
        """The probe on the denoisers' attention modules for the duration of one call."""
        from diffusers.models.attention import AttentionModuleMixin

        handles = [
            module.register_forward_pre_hook(self._seen, with_kwargs=True)
            for model in denoisers(pipe)
            for module in model.modules()
            if isinstance(module, AttentionModuleMixin)
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

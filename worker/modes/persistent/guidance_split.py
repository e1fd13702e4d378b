"""`GuidanceSplit`: classifier-free guidance split across 2 ranks by a hook on the denoiser.

Every rank runs the same pipeline call with the same seeds, so every rank holds the same
latents at every step. The hook wraps the `forward` of the pipeline's denoisers
(`transformer`, `transformer_2`, `unet`) and splits the guidance work between ranks 0 and 1,
so that each call returns on every rank exactly what the full call would:

- *batched* (SD, SDXL, SD3, PixArt, Sana, CogVideoX, LTX-Video, Mochi, ...: one call per step
  on the batch [uncond, cond] of 2N): every tensor argument whose first dimension is 2N
  (positional or keyword, also inside a dict such as `added_cond_kwargs`) is cut in halves;
  rank r computes half r, the outputs are all-gathered and concatenated.
- *sequential* (Wan, Flux with `true_cfg_scale`, Qwen-Image, HunyuanVideo with true cfg,
  SkyReels-V2: two calls per step, cond then uncond, the first result read only after the
  second call): rank 0 computes call 1, rank 1 call 2; the rank that skips a call returns a
  placeholder of the output's shape, and at the end of call 2 both results are broadcast into
  the placeholders, in place, before it returns.
- *single* (no guidance: one call of batch N): rank 0 computes and broadcasts its output.

The pattern is read at run time: step 1 runs unsplit on every rank while the hook counts the
denoiser calls and their batch (the pipeline's `callback_on_step_end` marks the step's end,
`step_ended`); the split starts at step 2. A placeholder takes the shape and dtype the same call
returned at step 1 (one output tensor of N samples; Kandinsky 5's video transformer returns
fewer channels than its `hidden_states` carry, so the output's own shape is kept rather than the
input's), and only a call whose `hidden_states` are shaped as at step 1 is split. Any other
pattern (three calls a step, a batch of neither N nor 2N, an argument with the batch in its
second dimension) runs unsplit on every rank; so does a later call whose input shape is not
step 1's. A sequential step that ends after one call (the second never came to fill the
placeholder) raises `SplitBroken`: the ranks' latents would no longer agree. A pipeline
without a step callback (HunyuanVideo 1.5) ends its steps at its progress bar's `update()`
(`events.attach_step_hook`).

With more than 2 ranks, ranks 2 and up compute nothing and receive both halves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

DENOISERS = ("transformer", "transformer_2", "unet")

OBSERVING = "observing"  # step 1: every rank computes every call, the hook counts them
BATCHED = "batched"  # one call per step on [uncond, cond]: halves
SEQUENTIAL = "sequential"  # two calls per step (cond, uncond): one each
SINGLE = "single"  # one call of batch N, no guidance: rank 0 computes
UNSPLIT = "unsplit"  # anything else: every rank computes every call


class SplitBroken(RuntimeError):
    """The pipeline's calls per step changed after the split began; the ranks' latents may differ."""


@dataclass
class _Seen:
    """One denoiser call of step 1: its batch, input shape and output (the placeholders' model)."""

    batch: int
    hidden_shape: tuple[int, ...]
    output: Any
    shapes: list[tuple[tuple[int, ...], torch.dtype]]
    batch_elsewhere: bool = False  # an argument holds the batch in its second dimension


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a denoiser's output (a tensor, a tuple or list, a dict or `BaseOutput`), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _rebuild(value: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """`value` with its tensors replaced, in order, by `tensors`."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    if isinstance(value, tuple | list):
        return type(value)(_rebuild(v, tensors) for v in value)
    if isinstance(value, Mapping):
        items = {k: _rebuild(v, tensors) for k, v in value.items()}
        return type(value)(**items) if type(value) is not dict else items
    return value


def _half(value: Any, batch: int, part: int) -> Any:
    """Half `part` of a tensor whose first dimension is `batch` (also inside a dict)."""
    if isinstance(value, torch.Tensor):
        return value.chunk(2)[part] if value.dim() >= 1 and value.shape[0] == batch else value
    if isinstance(value, dict):
        return {k: _half(v, batch, part) for k, v in value.items()}
    return value


def _contiguous(out: Any) -> tuple[Any, torch.Tensor]:
    """A one-tensor output with its tensor contiguous (collectives need that), and the tensor."""
    (tensor,) = _tensors(out)
    if tensor.is_contiguous():
        return out, tensor
    tensor = tensor.contiguous()
    return _rebuild(out, iter([tensor])), tensor


def _batch_second(args: tuple[Any, ...], kwargs: dict[str, Any], batch: int) -> bool:
    """Whether a tensor argument (also inside a dict) has `batch` as its second dimension:
    HiDream-I1 passes its Llama states as (layers, batch, tokens, width), which halving by the
    first dimension would cut across layers. Such a pipeline runs unsplit (a coincidence, a
    second dimension of 2N that is no batch, costs only the speed-up)."""
    values = [*args, *kwargs.values()]
    values += [v for d in values if isinstance(d, dict) for v in d.values()]
    return any(isinstance(v, torch.Tensor) and v.dim() >= 3 and v.shape[1] == batch for v in values)


def _hidden_states(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    for name in ("hidden_states", "sample"):  # transformers' name, then the UNets'
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return value
    return next((a for a in args if isinstance(a, torch.Tensor)), None)


def denoisers(pipe: Any) -> list[torch.nn.Module]:
    """The pipeline's denoising models (both experts of Wan 2.2)."""
    found = []
    for name in DENOISERS:
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module) and module not in found:
            found.append(module)
    return found


class GuidanceSplit:
    """The hook of one pipeline call on one rank; `batch` is N, the outputs the call makes."""

    def __init__(self, rank: int, world_size: int, batch: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.batch = batch
        self.pattern = OBSERVING
        self._seen: list[_Seen] = []
        self._calls = 0  # denoiser calls in the current step
        self._first: torch.Tensor | None = None  # a sequential step's call-1 result (or placeholder)
        self._step_unsplit = False
        self.steps = 0
        # What this rank did, for the report (and for tests that the work really was shared).
        self.denoiser_calls = 0
        self.computed_calls = 0
        self.computed_samples = 0

    def stats(self) -> dict[str, Any]:
        """This rank's share of the work: the pattern and the denoiser calls and samples it computed."""
        return {
            "pattern": UNSPLIT if self.pattern == OBSERVING else self.pattern,  # never saw a step end
            "denoiser_calls": self.denoiser_calls,
            "computed_calls": self.computed_calls,
            "computed_samples": self.computed_samples,
        }

    @contextmanager
    def installed(self, pipe: Any) -> Iterator[None]:
        """The hook on the pipeline's denoisers for the duration of one call."""
        saved = []
        for module in denoisers(pipe):
            saved.append((module, module.__dict__.get("forward")))
            # An instance attribute: nn.Module.__call__ looks `forward` up on the instance.
            module.forward = functools.partial(self._forward, module.forward)
        try:
            yield
        finally:
            for module, previous in saved:
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous

    # ---- step ends ---------------------------------------------------------------------------

    def step_ended(self) -> None:
        """Called on every rank at the end of each denoising step (the step callback)."""
        calls, self._calls = self._calls, 0
        self._step_unsplit, self._first = False, None
        self.steps += 1
        if self.pattern == OBSERVING:
            self.pattern = self._decide()
        elif self.pattern == SEQUENTIAL and calls == 1:
            raise SplitBroken(
                f"step {self.steps} made 1 denoiser call where step 1 made 2 (cond, uncond): the "
                "guidance split cannot follow this pipeline"
            )

    def _decide(self) -> str:
        seen, n = self._seen, self.batch
        if self.world_size < 2 or not seen:
            return UNSPLIT
        if (
            len(seen) == 1
            and seen[0].batch == 2 * n
            and not seen[0].batch_elsewhere
            and all(s[0] and s[0][0] == 2 * n for s in seen[0].shapes)
        ):
            return BATCHED
        # Placeholders: one output tensor of the batch's samples.
        single = all(len(s.shapes) == 1 and s.shapes[0][0][:1] == (n,) for s in seen)
        if len(seen) == 2 and all(s.batch == n for s in seen) and single:
            return SEQUENTIAL
        if len(seen) == 1 and seen[0].batch == n and single:
            return SINGLE
        return UNSPLIT

    # ---- the calls ---------------------------------------------------------------------------

    def _forward(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hidden = _hidden_states(args, kwargs)
        shape = tuple(hidden.shape) if hidden is not None else ()
        batch = shape[0] if shape else 0
        self._calls += 1
        self.denoiser_calls += 1
        call = self._calls
        if self.pattern == OBSERVING:
            out = self._compute(original, args, kwargs, batch)
            shapes = [(tuple(t.shape), t.dtype) for t in _tensors(out)]
            elsewhere = _batch_second(args, kwargs, batch)
            self._seen.append(_Seen(batch, shape, out, shapes, elsewhere))
            return out
        if self.pattern == BATCHED:
            if shape == self._seen[0].hidden_shape:
                return self._batched(original, args, kwargs, batch)
        elif self.pattern == SEQUENTIAL:
            return self._sequential(original, args, kwargs, call, shape, hidden)
        elif self.pattern == SINGLE and call == 1 and shape == self._seen[0].hidden_shape:
            return self._single(original, args, kwargs, hidden)
        return self._compute(original, args, kwargs, batch)

    def _compute(
        self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], batch: int
    ) -> Any:
        self.computed_calls += 1
        self.computed_samples += batch
        return original(*args, **kwargs)

    def _placeholder(self, seen: _Seen, like: torch.Tensor | None) -> Any:
        device = like.device if like is not None else None
        tensors = iter([torch.empty(shape, dtype=dtype, device=device) for shape, dtype in seen.shapes])
        return _rebuild(seen.output, tensors)

    def _batched(
        self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], batch: int
    ) -> Any:
        import torch.distributed as dist

        if self.rank < 2:
            part = self.rank
            halves = [_half(a, batch, part) for a in args]
            out = self._compute(
                original, tuple(halves), {k: _half(v, batch, part) for k, v in kwargs.items()}, batch // 2
            )
        else:  # a third rank: computes nothing, contributes a placeholder to the gather
            seen = self._seen[0]
            like = _hidden_states(args, kwargs)
            halved = _Seen(
                seen.batch // 2, (), seen.output, [((s[0] // 2, *s[1:]), d) for s, d in seen.shapes]
            )
            out = self._placeholder(halved, like)
        gathered = []
        for tensor in _tensors(out):
            parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
            dist.all_gather(parts, tensor.contiguous())
            gathered.append(torch.cat(parts[:2]))
        return _rebuild(out, iter(gathered))

    def _sequential(
        self,
        original: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: int,
        shape: tuple[int, ...],
        hidden: torch.Tensor | None,
    ) -> Any:
        import torch.distributed as dist

        if call > 2:
            raise SplitBroken(f"step {self.steps + 1} made a third denoiser call where step 1 made 2")
        seen = self._seen[call - 1]
        if call == 1:
            self._step_unsplit = shape != seen.hidden_shape  # this step runs unsplit on every rank
        if self._step_unsplit:
            return self._compute(original, args, kwargs, shape[0] if shape else 0)
        mine = self.rank == call - 1  # rank 0: call 1 (cond), rank 1: call 2 (uncond)
        same = shape == seen.hidden_shape
        if mine or not same:  # a second call shaped unlike step 1's: every rank computes it
            out = self._compute(original, args, kwargs, shape[0] if shape else 0)
        else:
            out = self._placeholder(seen, hidden)
        out, result = _contiguous(out)
        if call == 1:
            self._first = result
            return out
        assert self._first is not None
        dist.broadcast(self._first, 0)  # call 1's result from rank 0, in place on the others
        if same:
            dist.broadcast(result, 1)
        self._first = None
        return out

    def _single(
        self,
        original: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        hidden: torch.Tensor | None,
    ) -> Any:
        import torch.distributed as dist

        seen = self._seen[0]
        out = (
            self._compute(original, args, kwargs, seen.batch)
            if self.rank == 0
            else self._placeholder(seen, hidden)
        )
        out, result = _contiguous(out)
        dist.broadcast(result, 0)
        return out

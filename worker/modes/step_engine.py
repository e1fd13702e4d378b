"""The step engine: concurrent pipeline calls of one model share each denoiser forward.

Requests are scheduled whole, but the work happens in denoising steps. Here every pipeline call
of an eligible family (`eligible`) runs as it always does, in its own thread, with its own
scheduler, step count, guidance, strength and generators; only the denoiser (the UNet, or the
transformer and Wan 2.2's second expert) is shared. The call's copy of the pipeline gets a
`SharedDenoiser` in its place, and a forward on it becomes a `Call` handed to the engine's
thread, which runs the waiting calls of one denoiser as one batched forward (rows concatenated,
per-row timesteps) and hands each call its rows back.

The step boundary is a round: the engine runs a denoiser's forward once every call that takes
part in its batch has handed in its next forward. A call joins the batch with its first forward,
whatever the others' step (a request that arrives while a batch runs is in the next step, not
behind the whole batch), and leaves at its last step, when its decode and export begin in its
own thread while the rows left take their next step. Text encoding and image encoding happen
in the joining call's thread too, before its first forward: off the denoise path.

Rows: each output of a request is a row, and classifier-free guidance doubles it (Wan and
Flux's true CFG run the two halves as two forwards, which the engine batches as any other). A
round takes at most `rows` rows; the rest run in a second forward of the same round, by
priority, then arrival, so a call never overtakes a call of higher priority. Calls whose
arguments cannot be concatenated (another size, another `max_sequence_length`) run as separate
forwards of the round.

Preemption: when the calls of several denoisers (other models, or another expert) wait at
once, the one with the highest priority runs; the others are paused at that step boundary, their
latents and scheduler state kept by their threads, and resume where they stopped. A paused
batch cannot starve: it runs after `max_skips` rounds passed over it or `max_pause_s`. A new
batch does not start while `max_paused` batches are paused (or `max_paused_bytes` of their
inputs are held); its calls wait.

A failed forward never costs another job: when a batched forward raises, each call runs alone
and only the call whose forward fails gets the exception. The engine thread runs a forward in
the autograd mode its callers are in (each call says), so nothing is recorded for backward.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# The pipeline classes whose denoiser forwards the engine batches (docs/worker.md, "The step
# engine"): their loops call the denoiser with every argument either per row or shared.
PIPELINES = frozenset(
    {
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionXLPipeline",
        "StableDiffusionXLImg2ImgPipeline",
        "StableDiffusion3Pipeline",
        "StableDiffusion3Img2ImgPipeline",
        "FluxPipeline",
        "FluxImg2ImgPipeline",
        "WanPipeline",
    }
)
DENOISERS = ("unet", "transformer", "transformer_2")
# Arguments given once per call, not per row, even when their first dimension is the batch's
# (Flux's position ids: one per token, the same for every row of a size).
SHARED_ARGUMENTS = frozenset({"txt_ids", "img_ids"})
# Arguments a pipeline may give as one value for all its rows: made one per row.
ROW_SCALARS = frozenset({"timestep"})


def eligible(pipeline: Any) -> bool:
    """Whether calls of `pipeline` (the task's pipeline) may share their denoiser's forwards."""
    return type(pipeline).__name__ in PIPELINES and any(getattr(pipeline, n, None) for n in DENOISERS)


@dataclass(eq=False)
class Member:
    """One pipeline call taking part in the engine: its jobs, their priority, what it shared."""

    job_ids: list[str]
    priority: int
    seq: int
    pause_note: Any = None  # called with the reason when the call's batch is paused
    group: Group | None = None
    joined_at_forward: int = -1
    forwards: int = 0
    rows: int = 0
    peak_rows: int = 0
    preemptions: int = 0

    def report(self) -> dict[str, Any]:
        """What `config_resolved["step_engine"]` says of the call."""
        return {
            "joined_at_forward": max(self.joined_at_forward, 0),
            "forwards": self.forwards,
            "mean_rows": round(self.rows / self.forwards, 2) if self.forwards else 0,
            "peak_rows": self.peak_rows,
            "preemptions": self.preemptions,
        }


@dataclass(eq=False)
class Call:
    """One forward a member handed in: its arguments by name, its rows, and what came back."""

    member: Member
    arguments: dict[str, Any]
    rows: int
    mode: tuple[bool, bool]  # (inference mode, grad enabled) of the calling thread
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class Group:
    """The running batch of one denoiser: its members and the forwards they handed in."""

    module: Any
    signature: inspect.Signature  # of the module's forward: positional arguments get their names
    active: dict[Member, None] = field(default_factory=dict)  # in joining order
    pending: list[Call] = field(default_factory=list)
    forwards: int = 0
    skipped: int = 0
    paused_since: float = 0.0
    held_bytes: int = 0

    def ready(self) -> bool:
        """Every member has handed in its next forward (the step boundary)."""
        waiting = {call.member for call in self.pending}
        return bool(self.pending) and all(m in waiting for m in self.active)

    def started(self) -> bool:
        return self.forwards > 0 and bool(self.active)

    def urgency(self) -> int:
        """The highest priority among the batch's calls."""
        members = [*self.active, *(call.member for call in self.pending)]
        return max((m.priority for m in members), default=0)

    def oldest(self) -> int:
        return min((m.seq for m in self.active), default=min(c.member.seq for c in self.pending))


class StepEngine:
    """Runs the denoiser forwards of concurrent pipeline calls, batched at step boundaries."""

    def __init__(
        self,
        rows: int = 16,
        max_paused: int = 2,
        max_paused_bytes: int = 0,
        max_skips: int = 8,
        max_pause_s: float = 30.0,
    ) -> None:
        self.rows = max(1, rows)
        self.max_paused = max_paused
        self.max_paused_bytes = max_paused_bytes
        self.max_skips = max(1, max_skips)
        self.max_pause_s = max_pause_s
        self._cond = threading.Condition()
        self._groups: dict[int, Group] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.preemptions = 0  # batches paused for another, since start (metrics)
        self._busy = False  # a forward runs (a round on the engine's thread, or a lone call's own)

    # ---- the pipeline call's side ----------------------------------------------------------

    @contextmanager
    def member(self, job_ids: list[str], priority: int, pause_note: Any = None) -> Iterator[Member]:
        """A pipeline call's membership: it leaves the engine when the call ends, however."""
        member = Member(list(job_ids), priority, next(self._seq), pause_note)
        try:
            yield member
        finally:
            self.leave(member)

    def share(self, view: Any, member: Member) -> None:
        """Put shared denoisers in `view` (the call's own copy of the pipeline)."""
        for name in DENOISERS:
            module = getattr(view, name, None)
            if module is not None:
                object.__setattr__(view, name, SharedDenoiser(self, module, member))

    def leave(self, member: Member) -> None:
        """`member` takes no more forwards (its last step is done, or its call ended)."""
        with self._cond:
            if member.group is not None:
                member.group.active.pop(member, None)
                member.group = None
            self._cond.notify_all()

    def forward(self, module: Any, member: Member, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One forward of `member` on `module`, run in the next round of its batch (blocks)."""
        import torch

        group = self._group(module)
        arguments = _bind(group.signature, args, kwargs)
        call = Call(
            member, arguments, _rows(arguments), (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        )
        with self._cond:
            if member.group is not group:  # joins this denoiser's batch (or moves to it from another)
                if member.group is not None:
                    member.group.active.pop(member, None)
                member.group = group
                group.active[member] = None
                if member.joined_at_forward < 0:
                    member.joined_at_forward = group.forwards
            inline = not self._busy and self._alone(group, member)
            if inline:  # nothing to batch with: run it here, without a hop to the engine's thread
                self._busy = True
                self._count(group, [member], call.rows)
            else:
                group.pending.append(call)
                self._cond.notify_all()
                self._ensure_thread()
        if inline:
            try:
                return module(*args, **kwargs)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _alone(self, group: Group, member: Member) -> bool:
        """`member` is the only call of the engine (under the lock)."""
        if group.pending or len(group.active) != 1:
            return False
        return all(g is group or not (g.active or g.pending) for g in self._groups.values())

    def _count(self, group: Group, members: list[Member], rows: int) -> None:
        """A forward of `rows` rows of `members` on `group`'s denoiser (under the lock)."""
        group.forwards += 1
        for member in members:
            member.forwards += 1
            member.rows += rows
            member.peak_rows = max(member.peak_rows, rows)

    def _group(self, module: Any) -> Group:
        with self._cond:
            group = self._groups.get(id(module))
            if group is None or group.module is not module:
                # A compiled module's forward takes (*args, **kwargs): name them from the original's.
                forward = getattr(module, "_orig_mod", module).forward
                group = self._groups[id(module)] = Group(module, inspect.signature(forward))
            return group

    # ---- the engine's thread ---------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="omnirt-steps", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                chosen = None if self._busy else self._next_round()
                while chosen is None:
                    self._cond.wait(timeout=1.0)
                    chosen = None if self._busy else self._next_round()
                group, calls = chosen
                self._busy = True
            try:
                self._run_round(group, calls)
            except BaseException as exc:  # never leave a caller waiting
                log.exception("step engine round failed")
                for call in calls:
                    if not call.done.is_set():
                        call.error = exc
                        call.done.set()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_round(self) -> tuple[Group, list[Call]] | None:
        """The batch to step now and the calls of its round (under the lock), or None to wait.

        The most urgent batch that may run holds the device: a ready batch of lower priority
        waits (paused) even while that one is between two steps, since it is about to hand in its
        next forward; batches of equal priority step in turns as they get ready, the oldest first.
        A batch passed over `max_skips` rounds in a row, or paused `max_pause_s`, runs next.
        """
        now = time.monotonic()
        for key in [k for k, g in self._groups.items() if not g.active and not g.pending]:
            del self._groups[key]  # a denoiser no call uses (its model may be unloaded)
        live = list(self._groups.values())
        started = [g for g in live if g.started()]
        runnable = [g for g in live if g.started() or self._may_start(g, started)]
        ready = [g for g in runnable if g.ready()]
        if not ready:
            return None
        starving = [g for g in ready if g.paused_since and self._starving(g, now)]
        if starving:
            group = min(starving, key=lambda g: g.paused_since)
            group.skipped = 0
        else:
            top = max(g.urgency() for g in runnable)
            candidates = [g for g in ready if g.urgency() == top]
            if not candidates:
                for other in ready:  # paused until the more urgent batch is done
                    self._pause(other, top, now)
                return None
            group = min(candidates, key=lambda g: g.oldest())
            group.skipped, group.paused_since = 0, 0.0
        for other in ready:
            if other is not group and other.started():
                other.skipped += 1
                self._pause(other, group.urgency(), now)
        calls, group.pending = group.pending, []
        return group, calls

    def _starving(self, group: Group, now: float) -> bool:
        return group.skipped >= self.max_skips or now - group.paused_since >= self.max_pause_s

    def _may_start(self, group: Group, started: list[Group]) -> bool:
        """A new batch may start while the batches it would pause stay within the bounds."""
        paused = [g for g in started if g is not group]
        if len(paused) > self.max_paused:
            return False
        held = sum(g.held_bytes for g in paused)
        return not (self.max_paused_bytes and paused and held > self.max_paused_bytes)

    def _pause(self, group: Group, urgency: int, now: float) -> None:
        """`group` waits at its step boundary while a batch of `urgency` steps; a preemption (an
        event for its jobs) when that batch is more urgent."""
        if group.paused_since:
            return
        group.paused_since = now
        if urgency > group.urgency():
            self.preemptions += 1
            reason = f"paused at a step boundary: a batch of priority {urgency} runs first"
            for member in group.active:
                member.preemptions += 1
                if member.pause_note is not None:
                    member.pause_note(reason)

    def _run_round(self, group: Group, calls: list[Call]) -> None:
        """One step of `group`: its calls in batched forwards of at most `rows` rows each."""
        calls.sort(key=lambda c: (-c.member.priority, c.member.seq))
        for batch in _batches(calls, self.rows):
            self._run_batch(group, batch)
        if self.max_paused_bytes:  # what the batch holds while paused, for that bound only
            with self._cond:
                group.held_bytes = sum(_bytes(c.arguments) for c in calls)

    def _run_batch(self, group: Group, batch: list[Call]) -> None:
        with self._cond:
            self._count(group, [c.member for c in batch], sum(c.rows for c in batch))
        if len(batch) == 1:
            _finish(batch[0], lambda: _run(group.module, batch[0].mode, batch[0].arguments))
            return
        try:
            joined = _concat([c.arguments for c in batch], [c.rows for c in batch])
            output = _run(group.module, batch[0].mode, joined)
            parts = _split(output, [c.rows for c in batch])
        except Exception:  # each alone: only the call whose forward fails gets its error
            log.debug("a batched forward failed; its calls run one by one", exc_info=True)
            for call in batch:
                _finish(call, lambda call=call: _run(group.module, call.mode, call.arguments))
            return
        for call, part in zip(batch, parts, strict=True):
            call.result = part
            call.done.set()


class SharedDenoiser:
    """Stands in for a pipeline call's denoiser: forwards go through the engine, all else to the module."""

    def __init__(self, engine: StepEngine, module: Any, member: Member) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_member", member)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine.forward(self._module, self._member, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._module, name, value)


# ---- batching the arguments ------------------------------------------------------------------


def _bind(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The forward's arguments by name (positional ones named from its signature)."""
    if not args:
        return dict(kwargs)
    return dict(signature.bind_partial(*args, **kwargs).arguments)


def _first_tensor(arguments: dict[str, Any]) -> Any:
    import torch

    for value in arguments.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value
    raise ValueError("a denoiser forward without a batched input")


def _rows(arguments: dict[str, Any]) -> int:
    return int(_first_tensor(arguments).shape[0])


def _batches(calls: list[Call], limit: int) -> Iterator[list[Call]]:
    """`calls` as forwards of at most `limit` rows whose arguments can be concatenated, in order."""
    left = list(calls)
    while left:
        head = left.pop(0)
        batch, rows, rest = [head], head.rows, []
        for call in left:
            if rows + call.rows <= limit and call.mode == head.mode and _fits(head.arguments, call.arguments):
                batch.append(call)
                rows += call.rows
            else:
                rest.append(call)
        left = rest
        yield batch


def _fits(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two calls' arguments concatenate: the same names, row tensors of one shape past
    the first dimension, shared values equal."""
    if a.keys() != b.keys():
        return False
    rows_a, rows_b = _rows(a), _rows(b)
    return all(_value_fits(name, a[name], b[name], rows_a, rows_b) for name in a)


def _value_fits(name: str, x: Any, y: Any, rows_x: int, rows_y: int) -> bool:
    import torch

    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_value_fits(k, x[k], y[k], rows_x, rows_y) for k in x)
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.dtype != y.dtype or x.device != y.device:
            return False
        if _per_row(name, x, rows_x) and _per_row(name, y, rows_y):
            return x.shape[1:] == y.shape[1:]
        if name in ROW_SCALARS and x.dim() == 0 and y.dim() == 0:
            return True
        return x.shape == y.shape and bool(torch.equal(x, y))
    if name in ROW_SCALARS and isinstance(x, int | float) and isinstance(y, int | float):
        return True
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return False
    try:
        return bool(x == y)
    except Exception:
        return x is y


def _per_row(name: str, value: Any, rows: int) -> bool:
    return name not in SHARED_ARGUMENTS and value.dim() > 0 and value.shape[0] == rows


def _concat(arguments: list[dict[str, Any]], rows: list[int]) -> dict[str, Any]:
    return {name: _concat_value(name, [a[name] for a in arguments], rows) for name in arguments[0]}


def _concat_value(name: str, values: list[Any], rows: list[int]) -> Any:
    import torch

    first = values[0]
    if isinstance(first, dict):
        return {k: _concat_value(k, [v[k] for v in values], rows) for k in first}
    if isinstance(first, torch.Tensor) and _per_row(name, first, rows[0]):
        return torch.cat(values)
    if name in ROW_SCALARS and (
        isinstance(first, int | float) or (isinstance(first, torch.Tensor) and first.dim() == 0)
    ):
        return torch.cat([_as_rows(v, n) for v, n in zip(values, rows, strict=True)])
    return first


def _as_rows(value: Any, rows: int) -> Any:
    import torch

    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return tensor.reshape(1).expand(rows)


def _split(output: Any, rows: list[int]) -> list[Any]:
    """Each call's share of a batched forward's output (a tuple, or a diffusers output)."""
    import torch

    total = sum(rows)

    def part(value: Any) -> list[Any]:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == total:
            return list(torch.split(value, rows))
        return [value] * len(rows)

    if isinstance(output, tuple):
        columns = [part(v) for v in output]
        return [tuple(column[i] for column in columns) for i in range(len(rows))]
    if hasattr(output, "keys") and hasattr(output, "__class__"):  # a diffusers BaseOutput
        fields = {k: part(output[k]) for k in output}
        return [type(output)(**{k: v[i] for k, v in fields.items()}) for i in range(len(rows))]
    return part(output)


def _run(module: Any, mode: tuple[bool, bool], arguments: dict[str, Any]) -> Any:
    import torch

    inference, grad = mode
    with torch.inference_mode(inference), torch.set_grad_enabled(grad):
        return module(**arguments)


def _finish(call: Call, run: Any) -> None:
    try:
        call.result = run()
    except BaseException as exc:
        call.error = exc
    call.done.set()


def _bytes(arguments: dict[str, Any]) -> int:
    import torch

    total = 0
    for value in arguments.values():
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            total += _bytes(value)
    return total

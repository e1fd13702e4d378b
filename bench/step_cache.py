"""Step caches: what each of diffusers' cache hooks saves per transformer family, and what it costs.

OmniRT exposes diffusers' cache hooks as `runtime.step_cache` kinds (`first_block`,
`pyramid_attention_broadcast`, `faster_cache`, `mag_cache`, `taylor_seer`; see
`omnirt.worker.runtime.step_cache`). This scenario measures each kind on each family's real
diffusers pipeline in this process (no daemons: it measures the cache, not OmniRT), configured
by OmniRT's own code as the worker's `legacy_call` does: `runtime_schema` parses the
`step_cache` table, `step_cache.check` refuses what a denoiser cannot take, and
`step_cache.enabled` hooks the denoiser around the call, under `torch.inference_mode()`.

The builtin tiny models have 1-2 transformer blocks, where skipping blocks saves nothing
measurable. So each family gets a bigger seeded random-weight denoiser of the same class (the
tiny transformer's config with 10 blocks and more heads, width 96-192) next to the tiny model's
other components (text encoders, VAE, scheduler), loaded with `from_pretrained` from the tiny
model's folder, at a size where one uncached call takes about a second on one CPU thread.

Per family and kind, cached and uncached calls alternate (same seed; the pair's order swaps
every round). The speed-up is the uncached median over the cached median of those calls; the
PSNR compares the cached call's decoded output (floats in [0, 1]) with the uncached one; the
attention computations skipped are counted as the worker counts them (`to_q` calls,
`step_cache.Usage`). A kind a family cannot take is "n/a" with the reason: OmniRT's refusal, or
diffusers' error.

    python -m bench.suite --only step_cache
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import _scenario as sc

NAME = "step_cache"
TITLE = "Step caches: diffusers' cache hooks per transformer family, speed-up and PSNR vs uncached"
PROMPT = "a red fox running through fresh snow"
SEED = 0
STEPS = 10
TEXT_TOKENS = 32  # max_sequence_length: short prompts, so the image tokens dominate the attention
# Said of a failure diffusers raised while hooking the denoiser, before the call.
UNMAPPED = (
    " (raised by diffusers while `step_cache.enabled` hooks the denoiser, before its try: not mapped "
    "to OmniRT's failure naming runtime.step_cache, so a worker reports it as INTERNAL)"
)
COMMAND = ".venv/bin/python -m bench.suite --only step_cache --json bench/results/step_cache.json --no-docs"


@dataclass(frozen=True)
class Family:
    """One transformer family: its tiny model, how its denoiser is scaled up, and the call."""

    name: str
    model: str  # the builtin tiny model whose other components are used
    transformer: dict[str, Any]  # overrides of the tiny transformer's config
    size: int  # square, in pixels
    frames: int  # 0 for an image pipeline
    guidance: dict[str, Any]  # the call's guidance arguments
    threshold: float  # first_block's, chosen so that it skips some blocks on this denoiser
    extra: dict[str, Any] = field(default_factory=dict)  # other call arguments

    @property
    def call(self) -> dict[str, Any]:
        """The call's arguments besides prompt, generator and output type."""
        frames = {"num_frames": self.frames} if self.frames else {}
        size = {"height": self.size, "width": self.size}
        return {**size, **frames, "num_inference_steps": STEPS, **self.guidance, **self.extra}


def _wide(layers: int, heads: int, **more: Any) -> dict[str, Any]:
    return {"num_layers": layers, "num_attention_heads": heads, **more}


_TEXT = {"max_sequence_length": TEXT_TOKENS}
# The tiny models' head widths stay (their RoPE axes are sized for them): more heads, more blocks.
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("wan", "tiny-wan", _wide(10, 12, ffn_dim=384), 96, 9, {"guidance_scale": 5.0}, 0.13, _TEXT),
        Family(
            "flux",
            "tiny-flux",
            _wide(4, 12, num_single_layers=6),  # 4 double-stream + 6 single-stream blocks
            256,
            0,
            {"guidance_scale": 3.5},
            0.42,
            _TEXT,
        ),
        Family(
            "cogvideox",
            "tiny-cogvideox",
            _wide(10, 12, max_text_seq_length=TEXT_TOKENS),  # its positions include the text's
            96,
            9,
            {"guidance_scale": 6.0},
            0.1,
            _TEXT,
        ),
        Family(
            "ltx-video",
            "tiny-ltx-video",
            _wide(10, 24, cross_attention_dim=192),  # the captions are projected to the width
            160,
            17,
            {"guidance_scale": 3.0},
            0.1,
            _TEXT,
        ),
        Family(
            "hunyuan-video",
            "tiny-hunyuan-video",
            _wide(4, 12, num_single_layers=6),
            96,
            9,
            {"guidance_scale": 6.0},
            0.4,
            _TEXT,
        ),
        Family("mochi", "tiny-mochi", _wide(10, 12), 96, 7, {"guidance_scale": 4.5}, 0.4, _TEXT),
        Family(
            "skyreels-v2",
            "tiny-skyreels-v2",
            _wide(10, 12, ffn_dim=384),
            96,
            9,
            {"guidance_scale": 6.0},
            0.13,
            _TEXT,
        ),
        Family(
            "qwen-image",
            "tiny-qwen-image",
            _wide(10, 12),
            128,
            0,
            {"true_cfg_scale": 4.0, "negative_prompt": " "},  # true CFG: the model has no guidance input
            0.65,
            _TEXT,
        ),
    )
}
KINDS = ("first_block", "pyramid_attention_broadcast", "faster_cache", "mag_cache", "taylor_seer")


@dataclass(frozen=True)
class Settings:
    """Families, kinds and counts of the step cache scenario; the defaults are the full run."""

    families: tuple[str, ...] = tuple(FAMILIES)
    kinds: tuple[str, ...] = KINDS
    rounds: int = 4  # cached/uncached pairs per family and kind (even: each goes first as often)

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), families=("flux", "ltx-video"), rounds=1)


def kind_table(family: Family, kind: str, module: Any) -> dict[str, Any]:
    """The `step_cache` table this scenario gives `kind` on `family`'s denoiser `module`; the
    rest are OmniRT's defaults (pyramid_attention_broadcast: spatial_attention_block_skip_range
    2) and diffusers'."""
    table: dict[str, Any] = {"kind": kind}
    if kind == "first_block":
        table["threshold"] = family.threshold
    if kind == "taylor_seer":
        # The full mode hooks attention modules by Flux-style names; lite mode (caching the
        # output projection, skipping the blocks) elsewhere.
        table["use_lite_mode"] = not any(
            n.startswith("single_transformer_blocks.") for n, _ in module.named_modules()
        )
    if kind == "faster_cache" and getattr(module.config, "guidance_embeds", False):
        table["is_guidance_distilled"] = True  # no unconditional branch to skip (Flux, HunyuanVideo)
    return table


def psnr(a: Any, b: Any) -> float:
    """PSNR in dB of `a` against `b` (float arrays in [0, 1]); inf when they are equal."""
    import numpy as np

    mse = float(np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse)


def _db(value: float) -> float | None:
    """A PSNR for JSON, which has no inf: None stands for bit-identical outputs."""
    return None if math.isinf(value) else round(value, 2)


def load_family(family: Family, ctx: sc.Context) -> Any:
    """The family's pipeline: the tiny model's components with a bigger seeded denoiser."""
    import json

    import diffusers
    import torch

    from omnirt.worker.tiny import registry as tiny_models

    folder = Path(tiny_models.ensure_builtin(family.model, ctx.model_dir))
    index = json.loads((folder / "model_index.json").read_text())
    transformer_class = getattr(diffusers, index["transformer"][1])
    config = {**transformer_class.load_config(str(folder / "transformer")), **family.transformer}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = transformer_class.from_config(config).eval()
    pipeline_class = getattr(diffusers, index["_class_name"])
    pipeline = pipeline_class.from_pretrained(str(folder), transformer=transformer, dtype=torch.float32)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@dataclass
class Caller:
    """Calls one pipeline with one family's arguments and a fixed seed, with a step cache or not."""

    pipeline: Any
    family: Family
    seed: int = SEED

    def __call__(self, table: dict[str, Any] | None = None) -> tuple[tuple[float, float], Any, Any]:
        """((wall, CPU) seconds, decoded output, `step_cache.Usage` or None) of one call; a
        refusal or a failure with the cache on is OmniRT's JobFailure."""
        import torch

        from omnirt._internal import runtime_schema
        from omnirt.worker.runtime import step_cache
        from omnirt.worker.runtime.options import Effective

        options = Effective(runtime_schema.parse({"step_cache": table} if table else {}))
        step_cache.check(self.pipeline, options)
        kwargs = {
            "prompt": PROMPT,
            "generator": torch.Generator("cpu").manual_seed(self.seed),
            "output_type": "np",
            **self.family.call,
        }
        t0, cpu0 = time.perf_counter(), time.process_time()
        with torch.inference_mode(), step_cache.enabled(self.pipeline, options, STEPS) as usage:
            output = self.pipeline(**kwargs)
        seconds = (time.perf_counter() - t0, time.process_time() - cpu0)
        return seconds, output.frames if hasattr(output, "frames") else output.images, usage


def denoiser_profile(module: Any, call: Callable[[], Any]) -> dict[str, Any]:
    """One uncached call with counters: the denoiser's forwards and their batch, its attention
    modules, and the share of the call's CPU time spent in it."""
    projections = [m.to_q for m in module.modules() if hasattr(m, "to_q")]
    counts = {"forwards": 0, "batch": 0}
    spent = [0.0, 0.0]  # total, start of the current forward

    def before(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        counts["forwards"] += 1
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        counts["batch"] = int(hidden.shape[0]) if hidden is not None else 0
        spent[1] = time.process_time()

    def after(*_: Any) -> None:
        spent[0] += time.process_time() - spent[1]

    handles = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after),
    ]
    try:
        t0 = time.process_time()
        output = call()
        total = time.process_time() - t0
    finally:
        for handle in handles:
            handle.remove()
    return {
        **counts,
        "attentions": len(projections),
        "profiled_call_cpu_ms": sc.ms(total),
        "denoiser_share": round(spent[0] / total, 3) if total else 0.0,
        "output": output,
    }


def _reason(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    return text[:240] + ("..." if len(text) > 240 else "")


def measure_kind(caller: Caller, table: dict[str, Any], uncached: Any, rounds: int) -> dict[str, Any]:
    """`rounds` pairs of a cached and an uncached call; every uncached output is compared with
    `uncached` too (`repeat_psnr`, None: bit-identical, as the same seed must give)."""
    from omnirt._internal import runtime_schema
    from omnirt.worker.failures import JobFailure

    result: dict[str, Any] = {"kind": table["kind"], "settings": runtime_schema.parse({"step_cache": table})}
    result["settings"] = result["settings"]["step_cache"]
    cached_s: list[tuple[float, float]] = []  # (wall, CPU) seconds of each call
    uncached_s: list[tuple[float, float]] = []
    repeats: list[float] = []
    output = usage = None
    for round_ in range(rounds):
        for cached in (True, False) if round_ % 2 == 0 else (False, True):
            if not cached:
                seconds, frames, _ = caller()
                uncached_s.append(seconds)
                repeats.append(psnr(frames, uncached))
                continue
            try:
                seconds, frames, usage = caller(table)
            except JobFailure as exc:  # OmniRT's refusal, or diffusers' error during the call
                return {**result, "status": "n/a", "reason": _reason(exc)}
            except Exception as exc:  # diffusers' error while hooking: OmniRT lets it through
                return {
                    **result,
                    "status": "n/a",
                    "reason": f"{type(exc).__name__}: {_reason(exc)}",
                    "unmapped": True,
                }
            cached_s.append(seconds)
            output = frames if output is None else output
    assert usage is not None
    wall = [sc.median([s[0] for s in runs]) for runs in (cached_s, uncached_s)]
    cpu = [sc.median([s[1] for s in runs]) for runs in (cached_s, uncached_s)]
    return {
        **result,
        "status": "ok",
        "cached_p50_ms": sc.ms(wall[0]),
        "uncached_p50_ms": sc.ms(wall[1]),
        "speedup": sc.ratio(wall[1], wall[0]),
        "cpu_cached_p50_ms": sc.ms(cpu[0]),
        "cpu_uncached_p50_ms": sc.ms(cpu[1]),
        "cpu_speedup": sc.ratio(cpu[1], cpu[0]),
        # Every call's CPU milliseconds, in the order they ran.
        "cpu_cached_ms": [sc.ms(c) for _, c in cached_s],
        "cpu_uncached_ms": [sc.ms(c) for _, c in uncached_s],
        "psnr_db": _db(psnr(output, uncached)),
        "repeat_psnr_db": _db(min(repeats)),
        "attention_skipped": usage.reused,
        "attention_total": usage.forwards * usage.attentions,
    }


def measure_family(family: Family, settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    """Every kind of `settings` on one family, against the same uncached output."""
    import torch

    started = time.perf_counter()
    pipeline = load_family(family, ctx)
    module = pipeline.transformer
    caller = Caller(pipeline, family)
    uncached = caller()[1]  # also the warm-up: a first call pays for lazy set-up
    profile = denoiser_profile(module, lambda: Caller(pipeline, family, seed=SEED + 1)()[1])
    other_seed = profile.pop("output")
    kinds = []
    for kind in settings.kinds:
        kinds.append(measure_kind(caller, kind_table(family, kind, module), uncached, settings.rounds))
        if kinds[-1].get("unmapped"):
            # step_cache.enabled registers its counters before diffusers' hooks, and a failure
            # there leaves them on the modules: go on with a fresh pipeline.
            caller = Caller(load_family(family, ctx), family)
    lists = [m for n, m in module.named_children() if "blocks" in n and isinstance(m, torch.nn.ModuleList)]
    return {
        "family": family.name,
        "model": family.model,
        "pipeline": type(pipeline).__name__,
        "transformer": type(module).__name__,
        "blocks": sum(len(m) for m in lists),
        "width": module.config.num_attention_heads * module.config.attention_head_dim,
        "params_m": round(sum(p.numel() for p in module.parameters()) / 1e6, 2),
        "call": family.call,
        "steps": STEPS,
        **profile,
        # What an unrelated output scores: the same call with another seed.
        "other_seed_psnr_db": _db(psnr(other_seed, uncached)),
        "kinds": kinds,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def fastest(family: dict[str, Any]) -> dict[str, Any] | None:
    """The family's fastest kind that ran, by CPU time (the steadier measure on a shared machine)."""
    ran = [k for k in family["kinds"] if k["status"] == "ok" and k["cpu_speedup"]]
    return max(ran, key=lambda k: k["cpu_speedup"]) if ran else None


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    import torch

    unknown = sorted(set(settings.families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    from .suite import quiet_libraries  # the suite imports this module

    quiet_libraries()  # the suite does it only when it builds tiny-sd, which this scenario skips
    torch.set_num_threads(ctx.torch_threads)
    families = []
    for name in settings.families:
        families.append(measure_family(FAMILIES[name], settings, ctx))
        print(f"   {name}: {families[-1]['wall_s']} s", flush=True)
    rows = []
    for f in families:
        top = fastest(f)
        if top is not None:
            rows.append(
                sc.Row(
                    NAME,
                    f"{f['family']} ({f['transformer']}, {f['blocks']} blocks): fastest step cache, CPU p50",
                    f"{top['kind']} {sc.fmt_ms(top['cpu_cached_p50_ms'])}, {fmt_db(top['psnr_db'])}",
                    f"uncached {sc.fmt_ms(top['cpu_uncached_p50_ms'])}",
                    sc.ratio(top["cpu_cached_p50_ms"], top["cpu_uncached_p50_ms"]),
                ).as_dict()
            )
    machine = {"cpus": os.cpu_count(), "torch_threads": ctx.torch_threads}
    return {"settings": sc.settings_dict(settings), **machine, "families": families, "rows": rows}


def fmt_db(value: float | None) -> str:
    return "identical" if value is None else f"{value:.1f} dB"


def guidance(f: dict[str, Any]) -> str:
    """How the family's call guides: CFG batched, CFG as two denoiser calls, or embedded."""
    call = f["call"]
    scale = call.get("guidance_scale", call.get("true_cfg_scale"))
    if f["forwards"] == 2 * f["steps"]:
        return f"CFG {scale}, two denoiser calls a step"
    if f["batch"] == 2:
        return f"CFG {scale}, batched (cond + uncond)"
    return f"guidance {scale} embedded, no CFG"


def _settings_text(settings: dict[str, Any]) -> str:
    shown = [
        f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items() if k != "kind"
    ]
    return ", ".join(shown) or "defaults"


def markdown(result: dict[str, Any]) -> str:
    families = result["families"]
    kinds = list(dict.fromkeys(k["kind"] for f in families for k in f["kinds"]))
    notes: dict[str, int] = {}  # n/a reasons, numbered in order of appearance

    def cell(f: dict[str, Any], k: dict[str, Any]) -> str:
        if k["status"] != "ok":
            # One note for a reason several families share: their class names are in the rows.
            reason = k["reason"].replace(f"on {f['transformer']}:", "on the family's denoiser:")
            reason = reason.replace(f"for {f['transformer']} ", "for the family's denoiser ")
            if k.get("unmapped"):
                reason += UNMAPPED
            return f"n/a [{notes.setdefault(reason, len(notes) + 1)}]"
        return (
            f"CPU **x{k['cpu_speedup']:.2f}** ({sc.fmt_ms(k['cpu_cached_p50_ms'])} / "
            f"{sc.fmt_ms(k['cpu_uncached_p50_ms'])}), wall x{k['speedup']:.2f} "
            f"({sc.fmt_ms(k['cached_p50_ms'])} / {sc.fmt_ms(k['uncached_p50_ms'])}); "
            f"{fmt_db(k['psnr_db'])}; {k['attention_skipped']}/{k['attention_total']}"
        )

    described = []
    for f in families:
        call = f["call"]
        frames = f" x {call['num_frames']} frames" if "num_frames" in call else ""
        described.append(
            [
                f["family"],
                f"`{f['pipeline']}`: `{f['transformer']}`, {f['blocks']} blocks, width {f['width']}, "
                f"{f['params_m']} M parameters",
                f"{call['width']}x{call['height']}{frames}, {f['steps']} steps, {guidance(f)}",
                f"{f['forwards']} x {f['attentions']}",
                f"{round(100 * f['denoiser_share'])} %",
                fmt_db(f["other_seed_psnr_db"]),
            ]
        )
    by_kind = [
        [f["family"], *[cell(f, k) for kind in kinds for k in f["kinds"] if k["kind"] == kind]]
        for f in families
    ]
    repeats = [k["repeat_psnr_db"] for f in families for k in f["kinds"] if k["status"] == "ok"]
    repeat = (
        "identical"
        if all(r is None for r in repeats)
        else "NOT identical: " + ", ".join(map(fmt_db, repeats))
    )
    settings_by_kind = []
    for kind in kinds:
        seen: dict[str, list[str]] = {}
        for f in families:
            for k in f["kinds"]:
                if k["kind"] == kind:
                    seen.setdefault(_settings_text(k["settings"]), []).append(f["family"])
        texts = [f"{text} ({', '.join(names)})" if len(seen) > 1 else text for text, names in seen.items()]
        settings_by_kind.append(f"- `{kind}`: " + "; ".join(texts))
    parts = [
        "Each of diffusers' cache hooks that OmniRT exposes as a `runtime.step_cache` kind, on each "
        "family's real pipeline with a bigger seeded random-weight denoiser than its tiny model's (the "
        "other components are the tiny model's), configured by OmniRT's own code (`runtime_schema` "
        "parses the table, `step_cache.check` refuses, `step_cache.enabled` hooks the call), in the "
        "benchmark process, no daemons. Per family and kind, "
        f"{result['settings']['rounds']} cached and {result['settings']['rounds']} uncached calls "
        f"alternate with the same seed; torch threads: {result['torch_threads']}. Run alone with:",
        f"```sh\n{COMMAND}\n```",
        sc.md_table(
            [
                "family",
                "pipeline and denoiser",
                "call",
                "forwards x attentions",
                "in the denoiser",
                "other seed",
            ],
            described,
            right=3,
        ),
        '"forwards x attentions": the denoiser\'s calls in one uncached pipeline call times its attention '
        'modules; "in the denoiser": the share of an uncached call\'s CPU time spent there (the rest is '
        'the text encoders and the VAE, which no step cache shortens); "other seed": the PSNR of the '
        "uncached output of another seed against seed 0's, what an unrelated output scores.",
        sc.md_table(["family", *[f"`{k}`" for k in kinds]], by_kind, right=1),
        "Each cell: the speed-up (uncached median / cached median) in CPU time (of the benchmark process, "
        "which runs torch on one thread: what the call costs, and much steadier than wall time while "
        "other processes share the cores), with the cached / uncached medians, then the same in wall "
        "time; the PSNR of the cached output against the uncached one (decoded frames or image, floats "
        "in [0, 1]; identical: bit for bit); attention computations skipped out of the uncached call's "
        '(`to_q` calls not made, what the worker reports as `cache_hits["step_cache"]`). Every uncached '
        f"call of the run gave the same output as the first: {repeat}.",
        "\n".join(f"- [{n}] {reason}" for reason, n in notes.items()),
        "Settings (the `step_cache` table as OmniRT normalizes it; every other field is diffusers' "
        "default):\n\n" + "\n".join(settings_by_kind),
        "How to read it. The weights are random, so the PSNR says how far a cache moves this denoiser's "
        "output, not how a trained model's images look; compare it with the other seed's. "
        "`first_block` and `mag_cache` skip the remaining blocks while the first block's residual (or "
        "the accumulated magnitude ratio) changes little; how much that is depends on the weights, so "
        "first_block's threshold is chosen per family to skip some steps here (a real model wants "
        "its own). `faster_cache` approximates the unconditional branch from a batch that holds both "
        "(`is_guidance_distilled` where the model embeds guidance: then only its attention reuse is "
        "left), `mag_cache` needs magnitude ratios calibrated per model (diffusers ships Flux's), and "
        "`taylor_seer` runs its full mode where its attention patterns find Flux-style blocks, lite mode "
        "elsewhere. `pyramid_attention_broadcast` keeps one state per attention module, not one per "
        "cache context (first_block, mag_cache and taylor_seer keep one per branch): where a pipeline "
        "calls the denoiser twice a step (CFG as two calls), every other call is the unconditional one, so "
        "with a skip range of 2 each unconditional call reuses the conditional call's attention of the "
        "same step rather than an earlier step's, and where the two branches' text lengths differ "
        "(Qwen-Image's negative prompt) the reused output does not fit. A cache's own work (residual "
        "norms, Taylor factors, FFTs) costs time too, so a small "
        "skip can come out slower than no cache; on a shared machine expect ±20 % between runs.",
    ]
    load = result.get("loadavg_before"), result.get("loadavg_after")  # set by the suite
    if load[0] and load[1] and max(load[0][0], load[1][0]) >= 1 + result["torch_threads"]:
        parts.insert(
            2,  # after the command
            f"This run shared its {result['cpus']} CPUs: the load average was {load[0][0]:.2f} before and "
            f"{load[1][0]:.2f} after, where this scenario alone makes about {result['torch_threads']}, so "
            "other processes kept the cores busy meanwhile. Wall times move with their load; the CPU "
            "times in the cells less so.",
        )
    return "\n\n".join(p for p in parts if p)


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown, needs_models=False)

"""Fair share: one tenant floods the queue, another submits one job; how long does that job wait?

Two runs with the same settings, each with fresh daemons: `fifo` (no `--auth-keys`: every job
is the tenant "", the order before tenants existed, FIFO within a priority) and `fair` (a key
file with the tenants `flood` and `single`, weight 1 each, and an admin key to read the jobs
back). Each run starts one `omnirt-controller --max-batch-size 1` and one `omnirt-worker
--models null --slots SLOTS`; every job is a null job of one step sleeping `job_ms` ms
(`extra.sleep_ms_per_step`). The flooding tenant first runs `warmup` jobs (the controller's
run-time estimate of the model, which fair share charges each job, starts at 1 s and learns
from them), then submits `flood` jobs at `concurrency` in flight; once all are queued the other
tenant submits one. Reported from the controller's own timestamps: that job's wait (created ->
started), the flood jobs that started in between, and the flood's throughput (fair share must
not cost any).

    python -m bench.fair_share --flood 1000 --job-ms 20 --slots 2 --json out.json
    python -m bench.suite --only fair_share
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import omnirt
from omnirt.controller.edges.auth import key_digest
from omnirt.types import GenerateRequest, Job, JobState

from . import _machine
from . import _scenario as sc
from ._daemons import Controller, null_worker
from ._stacks import wait_connected

NAME = "fair_share"
TITLE = "Fair share: one tenant floods the queue, another submits one job (fair share vs FIFO)"
KEYS = {"flood": "flood-bench-key", "single": "single-bench-key", "ops": "ops-bench-key"}


@dataclass(frozen=True)
class Settings:
    """Sizes of the fair-share scenario; the defaults are the full run."""

    flood: int = 1000
    job_ms: int = 20
    slots: int = 2
    warmup: int = 50
    concurrency: int = 32

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), flood=200, warmup=30)


def key_file(folder: Path) -> Path:
    lines = []
    for tenant, key in KEYS.items():
        role = "admin" if tenant == "ops" else "user"
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'role = "{role}"', f'sha256 = "{key_digest(key)}"', ""]
    path = folder / "bench-keys.toml"
    path.write_text("\n".join(lines))
    return path


def _ms(a: datetime | None, b: datetime | None) -> float:
    return (b - a).total_seconds() * 1000 if a and b else 0.0


def _request(job_ms: int, seed: int) -> GenerateRequest:
    extra: dict[str, Any] = {"sleep_ms_per_step": job_ms}
    return GenerateRequest(model="null", prompt="fair share", num_inference_steps=1, seed=seed, extra=extra)


async def _flood(client: omnirt.AsyncClient, job_ms: int, count: int, concurrency: int) -> list[Job]:
    """Submit `count` jobs with `concurrency` Submit calls in flight; the jobs in submission order."""
    jobs: list[Job | None] = [None] * count
    next_index = 0

    async def submitter() -> None:
        nonlocal next_index
        while next_index < count:
            i = next_index
            next_index += 1
            jobs[i] = await client.submit(_request(job_ms, i))

    await asyncio.gather(*(submitter() for _ in range(min(concurrency, count))))
    return [j for j in jobs if j is not None]


async def _drained(admin: omnirt.AsyncClient, timeout_s: float) -> None:
    """Until no job is queued or running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while await admin.list_jobs(states=["queued", "running"], limit=1):
        if loop.time() > deadline:
            raise TimeoutError(f"jobs still queued or running after {timeout_s:.0f} s")
        await asyncio.sleep(0.25)


async def measure(address: str, settings: Settings, fair: bool) -> dict[str, Any]:
    """One run against a started controller and worker: the single job's wait and the flood's."""
    key = KEYS if fair else dict.fromkeys(KEYS, None)
    drain_s = 60 + 3 * settings.flood * settings.job_ms / 1000 / settings.slots
    async with (
        omnirt.AsyncClient(address, api_key=key["flood"], timeout=60) as flooder,
        omnirt.AsyncClient(address, api_key=key["single"], timeout=60) as single_client,
        omnirt.AsyncClient(address, api_key=key["ops"], timeout=60) as admin,
    ):
        await _flood(flooder, settings.job_ms, settings.warmup, settings.concurrency)
        await _drained(admin, drain_s)
        flood = await _flood(flooder, settings.job_ms, settings.flood, settings.concurrency)
        single = await single_client.submit(_request(settings.job_ms, 0))
        await _drained(admin, drain_s)
        done = {j.id: j for j in await admin.list_jobs(limit=settings.flood + settings.warmup + 10)}
    me = done[single.id]
    flood_jobs = [done[j.id] for j in flood]
    assert all(j.state is JobState.SUCCEEDED for j in [me, *flood_jobs]), "a job did not succeed"
    assert me.created_at and me.started_at
    ahead = [j for j in flood_jobs if j.started_at and me.created_at < j.started_at < me.started_at]
    first = min(j.created_at for j in flood_jobs if j.created_at)
    last = max(j.finished_at for j in flood_jobs if j.finished_at)
    run_ms = [_ms(j.started_at, j.finished_at) for j in flood_jobs]
    return {
        "mode": "fair" if fair else "fifo",
        "tenants": [me.tenant, flood_jobs[0].tenant],
        "single_wait_ms": round(_ms(me.created_at, me.started_at), 1),
        "single_latency_ms": round(_ms(me.created_at, me.finished_at), 1),
        "flood_jobs_ahead": len(ahead),
        "flood_queued_when_single_came": sum(
            1 for j in flood_jobs if j.started_at and j.started_at > me.created_at
        ),
        "job_run_ms_p50": round(statistics.median(run_ms), 1),
        "flood_jobs_per_s": round(len(flood_jobs) / max(1e-9, (last - first).total_seconds()), 1),
    }


def run_mode(settings: Settings, log_dir: Path, fair: bool) -> dict[str, Any]:
    mode_dir = log_dir / ("fair" if fair else "fifo")
    mode_dir.mkdir(parents=True, exist_ok=True)
    auth = ("--auth-keys", str(key_file(mode_dir))) if fair else ()
    queue = str(settings.flood + settings.warmup + 100)
    controller = Controller(
        mode_dir, "--max-batch-size", "1", "--max-queue", queue, *auth, api_key=KEYS["ops"] if fair else None
    ).start()
    worker = null_worker(
        mode_dir, controller.address, f"w-{NAME}", "--models", "null", "--slots", str(settings.slots)
    )
    try:
        worker.start()
        wait_connected(controller, [worker])
        return asyncio.run(measure(controller.address, settings, fair))
    finally:
        worker.stop()
        controller.stop()


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    modes = {name: run_mode(settings, ctx.log_dir, name == "fair") for name in ("fifo", "fair")}
    fifo, fair = modes["fifo"], modes["fair"]
    job_ms = fair["job_run_ms_p50"] or settings.job_ms
    flood = f"a flood of {settings.flood:,}, {settings.slots} slots"
    rows = [
        sc.Row(
            NAME,
            f"one job of another tenant behind {flood}: its wait (flood jobs started first)",
            f"fair share {sc.fmt_ms(fair['single_wait_ms'])} ({fair['flood_jobs_ahead']})",
            f"FIFO {sc.fmt_ms(fifo['single_wait_ms'])} ({fifo['flood_jobs_ahead']})",
            sc.ratio(fair["single_wait_ms"], fifo["single_wait_ms"]),
        ).as_dict(),
        sc.Row(
            NAME,
            "that wait in job run times (fair share)",
            f"{fair['single_wait_ms'] / job_ms:.2f} x {sc.fmt_ms(job_ms)}",
            "",
            sc.ratio(fair["single_wait_ms"], job_ms),
            "<= 2",
            sc.verdict(sc.ratio(fair["single_wait_ms"], job_ms), "<=", 2),
        ).as_dict(),
        sc.Row(
            NAME,
            "the flood's throughput: jobs/s",
            f"fair share {sc.fmt_rate(fair['flood_jobs_per_s'])}",
            f"FIFO {sc.fmt_rate(fifo['flood_jobs_per_s'])}",
            sc.ratio(fair["flood_jobs_per_s"], fifo["flood_jobs_per_s"]),
        ).as_dict(),
    ]
    return {
        "settings": sc.settings_dict(settings),
        "commit": _machine.describe().get("git_commit", ""),
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "modes": modes,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    header = [
        "mode",
        "the single job's wait",
        "flood jobs started first",
        "flood jobs still queued when it came",
        "its latency",
        "job run time (p50)",
        "flood jobs/s",
    ]
    labels = {"fifo": 'FIFO (auth off, tenant "")', "fair": "fair share (tenants flood, single)"}
    rows = [
        [
            labels[m["mode"]],
            sc.fmt_ms(m["single_wait_ms"]),
            m["flood_jobs_ahead"],
            f"{m['flood_queued_when_single_came']:,}",
            sc.fmt_ms(m["single_latency_ms"]),
            sc.fmt_ms(m["job_run_ms_p50"]),
            f"{m['flood_jobs_per_s']:,.1f}",
        ]
        for m in result["modes"].values()
    ]
    fair, fifo = result["modes"]["fair"], result["modes"]["fifo"]
    command = (
        f"python -m bench.fair_share --flood {s['flood']} --job-ms {s['job_ms']} --slots {s['slots']} "
        f"--warmup {s['warmup']} --concurrency {s['concurrency']}"
    )
    return "\n\n".join(
        [
            f"`{command}` (or `python -m bench.suite --only fair_share`; measured at commit "
            f"`{result.get('commit') or 'unknown'}`, {result.get('started_at', '')}): one `omnirt-controller "
            f"--max-batch-size 1` and one `omnirt-worker --models null --slots {s['slots']}`, fresh for each "
            f"mode; every job is a null job of one step sleeping {s['job_ms']} ms. The flooding tenant runs "
            f"{s['warmup']} jobs first (the run-time estimate fair share charges per job learns from them), "
            f"then submits {s['flood']:,} at {s['concurrency']} in flight; when all are queued the other "
            "tenant submits one. Times are the controller's (`created_at`, `started_at`, `finished_at`).",
            sc.md_table(header, rows),
            f"With fair share the other tenant's job started after **{fair['flood_jobs_ahead']}** of the "
            f"flood's jobs, **{sc.fmt_ms(fair['single_wait_ms'])}** after it was submitted "
            f"({fair['single_wait_ms'] / (fair['job_run_ms_p50'] or 1):.2f} job run times, {s['slots']} "
            f"slots), against {fifo['flood_jobs_ahead']:,} jobs and {sc.fmt_ms(fifo['single_wait_ms'])} "
            "in FIFO order; the flood itself ran at the same rate "
            f"({fair['flood_jobs_per_s']:,.1f} vs {fifo['flood_jobs_per_s']:,.1f} jobs/s). The wait in job "
            "times is what the issue asks for (about one job's time per slot: a slot frees up at most "
            "one job run after the job arrives).",
        ]
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown, needs_models=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fair_share", description=__doc__.split("\n")[0])
    defaults = Settings()
    for name, value in sc.settings_dict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value, help=f"default {value}")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    settings = Settings(**{k: getattr(args, k) for k in sc.settings_dict(defaults)})
    with tempfile.TemporaryDirectory(prefix="omnirt-bench-") as tmp:
        ctx = sc.Context(log_dir=Path(tmp), model_dir=Path(tmp) / "models", torch_threads=1)
        result = run(settings, ctx)
    print(sc.text_table(sc.COLUMNS, [sc.row_cells(r) for r in result["rows"]]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

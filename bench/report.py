"""The suite's table and docs/BENCHMARKS.md, written from the results JSON alone.

The prose lives in `bench/BENCHMARKS.template.md`; the numbers, the machine and the commands
come from the JSON of `python -m bench.suite` (and of `python -m bench.gpu`, when there is one).
To rewrite the docs from existing results without measuring again:

    python -m bench.report --suite bench/results/suite.json --gpu bench/results/gpu.json
"""

from __future__ import annotations

import argparse
import json
import string
import sys
from pathlib import Path
from typing import Any

from . import _machine
from . import _scenario as sc

TEMPLATE = Path(__file__).with_name("BENCHMARKS.template.md")


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """Every scenario's rows as cells; a skipped or failed scenario is one row saying so."""
    rows = []
    for name, entry in results["scenarios"].items():
        if entry["status"] == "ok":
            rows += [sc.row_cells(r) for r in entry.get("rows", [])]
        else:
            rows.append([name, entry.get("reason", ""), "", "", "", "", entry["status"]])
    return rows


def summary_text(results: dict[str, Any]) -> str:
    """The table the suite prints."""
    quick = " (--quick: smoke-check counts, not for comparison)" if results.get("quick") else ""
    head = f"OmniRT benchmark suite{quick}, {results['wall_s']} s"
    return head + "\n" + sc.text_table(sc.COLUMNS, table_rows(results))


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def machine_md(results: dict[str, Any]) -> str:
    m = results["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items())
    dirty = m.get("git_uncommitted") or []
    code = f"commit `{m.get('git_commit') or 'unknown'}`" + (
        f" plus {len(dirty)} uncommitted file(s)" if dirty else ""
    )
    builds = ", ".join(f"{k} {v} s" for k, v in results.get("model_build_s", {}).items()) or "-"
    rows = [
        ["CPUs", f"`nproc` = {m['nproc']} ({m['cpu_model']})"],
        ["memory", f"{m['mem_total_gib']} GiB"],
        ["load average at start", " / ".join(str(x) for x in m["loadavg_at_start"])],
        ["Python", f"{m['python']}; {packages}"],
        ["torch threads", f"{results['torch_threads']} in the benchmark process and in every worker"],
        ["tiny model build", builds],
        ["code", code],
        [
            "run",
            f"{results['started_at']}, {results['wall_s']} s" + (", `--quick`" if results["quick"] else ""),
        ],
    ]
    return sc.md_table(["", ""], rows, right=9)


def sections_md(results: dict[str, Any]) -> str:
    from .suite import SCENARIOS  # the suite imports this module

    parts = []
    for name, entry in results["scenarios"].items():
        scenario = SCENARIOS.get(name)
        title = entry.get("title") or name
        lines = [f"## `{name}`: {title.split(': ', 1)[-1]}"]
        lines.append(
            f"Ran in {entry['wall_s']} s; load average before / after: "
            f"{entry['loadavg_before'][0]:.2f} / {entry['loadavg_after'][0]:.2f}."
        )
        if entry["status"] == "ok" and scenario is not None:
            lines.append(scenario.markdown(entry))
        else:
            lines.append(f"**{entry['status']}**: {_md_escape(entry.get('reason', ''))}")
        parts.append("\n\n".join(lines))
    return "\n\n".join(parts)


def gpu_md(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return (
            "No GPU results are recorded yet: `python -m bench.gpu` writes `bench/results/gpu.json` "
            "on a CUDA machine, and the next `python -m bench.report` (or full suite run) puts them here. "
            "Its cases: overhead, batching, step cache, CFG parallel, and the continuous open loop on "
            "SDXL at 1024x1024 (whole-request against step-level scheduling); no session so far had a "
            "GPU machine lent to run them (`--smoke` runs the same code on the CPU in the test suite)."
        )
    from . import _gpu_report

    return _gpu_report.markdown(gpu)


def targets_md(results: dict[str, Any]) -> str:
    """One line per row that has a target: what, the ratio, the target, met or missed."""
    lines = []
    for entry in results["scenarios"].values():
        for row in entry.get("rows", []) if entry["status"] == "ok" else []:
            if row.get("target"):
                lines.append(
                    f"- {row['scenario']}, {row['case']}: ratio {row['ratio']:.2f}, target {row['target']}: "
                    f"**{row['verdict']}**"
                )
    return "Targets of the issue, in this run:\n\n" + "\n".join(lines) if lines else ""


def render(results: dict[str, Any], gpu: dict[str, Any] | None = None) -> str:
    """docs/BENCHMARKS.md for these results."""
    template = string.Template(TEMPLATE.read_text())
    table = sc.md_table(sc.COLUMNS, [[_md_escape(c) for c in r] for r in table_rows(results)], right=9)
    return template.substitute(
        command=results["command"],
        quick_note=(
            "\n> **These numbers come from a `--quick` run** (smoke-check counts): do not compare them.\n"
            if results["quick"]
            else ""
        ),
        machine=machine_md(results),
        table=table,
        targets=targets_md(results),
        sections=sections_md(results),
        gpu=gpu_md(gpu),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", type=Path, default=_machine.ROOT / "bench/results/suite.json")
    parser.add_argument("--gpu", type=Path, default=_machine.ROOT / "bench/results/gpu.json")
    parser.add_argument("--out", type=Path, default=_machine.ROOT / "docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    results = json.loads(args.suite.read_text())
    gpu = json.loads(args.gpu.read_text()) if args.gpu.exists() else None
    args.out.write_text(render(results, gpu))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A closed-loop load driver: `concurrency` callers share a bounded count of calls."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from omnirt.errors import OmniRTError

from ._stats import latency_summary_ms


@dataclass
class LoadResult:
    """What one run of the driver measured."""

    total: int
    concurrency: int
    wall_s: float
    latencies_s: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> int:
        return len(self.latencies_s)

    @property
    def rate(self) -> float:
        """Successful calls per second of wall time."""
        return self.ok / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "concurrency": self.concurrency,
            "ok": self.ok,
            "failures": dict(self.failures),
            "wall_s": round(self.wall_s, 3),
            "per_s": round(self.rate, 1),
            **latency_summary_ms(self.latencies_s),
        }


def merged(results: list[LoadResult]) -> LoadResult:
    """Several runs of one system as one: calls, wall time, latencies and failures added up."""
    out = LoadResult(total=0, concurrency=results[0].concurrency if results else 0, wall_s=0.0)
    for r in results:
        out.total += r.total
        out.wall_s += r.wall_s
        out.latencies_s += r.latencies_s
        out.failures.update(r.failures)
    return out


def failure_name(exc: BaseException) -> str:
    """A status name for a failed call (the OmniRT error's code, the RPC's code, or the type)."""
    if isinstance(exc, OmniRTError):
        return exc.code.name
    code = getattr(exc, "failure_code", None)  # e.g. bench._http.HttpFailure
    if isinstance(code, str):
        return code
    if isinstance(exc, grpc.RpcError):
        code = exc.code()
        return code.name if code is not None else "UNKNOWN"
    return type(exc).__name__


async def drive(
    call: Callable[[int], Awaitable[object]], total: int, concurrency: int, max_s: float
) -> LoadResult:
    """Run `call(i)` for i in 0..total-1 with `concurrency` in flight; stop starting calls after `max_s`."""
    result = LoadResult(total=total, concurrency=concurrency, wall_s=0.0)
    indexes = iter(range(total))
    started = time.perf_counter()
    stop_at = started + max_s

    async def caller() -> None:
        for i in indexes:
            if time.perf_counter() > stop_at:
                result.failures["NOT_STARTED_TIME_LIMIT"] += 1
                continue
            t0 = time.perf_counter()
            try:
                await call(i)
            except Exception as exc:
                result.failures[failure_name(exc)] += 1
            else:
                result.latencies_s.append(time.perf_counter() - t0)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - started
    return result

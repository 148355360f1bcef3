"""Capacity: the highest request rate at which a workload's latency SLOs still hold.

The question vLLM's SLA sweep, SGLang's QPS bisection and AIPerf's adaptive scale each answer for
one config, asked here of every config a study tries.  The search runs load steps on the server
that is already up: geometric growth from `min_rate` until a step fails, then geometric bisection
until the bracket is narrower than `resolution` (relative).  A fixed sweep at that resolution
over [min_rate, max_rate] needs log(max/min)/log(1 + resolution) steps; the search needs about
log2 of that, and `SloWatch` ends a failing step as soon as its p99 can no longer meet the SLO,
so the overloaded steps, the expensive ones, are the shortest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.bench.records import Cell
from tuner.bench.sources import TraceSource
from tuner.errors import UsageError

CAPACITY_KEYS = ("cell", "min_rate", "max_rate", "resolution", "step_requests", "growth")
SLO_QUANTITY = {"p99_ttft_ms": ("ttft", 99.0), "p99_tpot_ms": ("tpot", 99.0),
                "p90_ttft_ms": ("ttft", 90.0), "p90_tpot_ms": ("tpot", 90.0),
                "p99_e2el_ms": ("e2el", 99.0), "p90_e2el_ms": ("e2el", 90.0)}


@dataclass(frozen=True)
class CapacitySpec:
    """Which cell's traffic to scale and how finely; the SLOs are the workload's `slo`."""

    cell: int = 0
    min_rate: float = 0.5
    max_rate: float = 64.0
    resolution: float = 0.1
    step_requests: int = 200
    growth: float = 2.0

    def sweep_rates(self) -> list[float]:
        """The fixed sweep of the same resolution: a geometric grid from min to max."""
        n = math.ceil(math.log(self.max_rate / self.min_rate) / math.log1p(self.resolution))
        return [self.min_rate * (1 + self.resolution) ** i for i in range(n)] + [self.max_rate]


def parse_capacity(raw: Any, source: str, n_cells: int) -> CapacitySpec:
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: capacity: must be a mapping of {', '.join(CAPACITY_KEYS)}")
    for key in raw:
        if key not in CAPACITY_KEYS:
            raise UsageError(f"{source}: capacity.{key}: unknown key "
                             f"(allowed: {', '.join(CAPACITY_KEYS)})")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"{source}: capacity.{key}: must be a number >= 0, got {value!r}")
    d = CapacitySpec()
    spec = CapacitySpec(
        raw.get("cell", d.cell),
        float(raw.get("min_rate", d.min_rate)),
        float(raw.get("max_rate", d.max_rate)),
        float(raw.get("resolution", d.resolution)),
        raw.get("step_requests", d.step_requests),
        float(raw.get("growth", d.growth)),
    )
    if not (isinstance(spec.cell, int) and spec.cell < n_cells):
        raise UsageError(f"{source}: capacity.cell: must index one of the {n_cells} cells")
    if not 0 < spec.min_rate < spec.max_rate or spec.resolution <= 0 or spec.growth <= 1 \
            or not isinstance(spec.step_requests, int) or spec.step_requests < 10:
        raise UsageError(f"{source}: capacity: need 0 < min_rate < max_rate, resolution > 0, "
                         "growth > 1 and step_requests >= 10 (an integer)")
    return spec


def slo_limits(slo: Mapping[str, float]) -> dict[str, tuple[str, float, float]]:
    """The workload SLOs a load step can judge: metric -> (quantity, quantile, limit ms)."""
    return {m: (*SLO_QUANTITY[m], v) for m, v in slo.items() if m in SLO_QUANTITY}


class SloWatch:
    """Decides during a step that its percentile SLOs are already lost.

    With n planned requests, numpy's percentile q is at least the value of rank floor(q/100 x
    (n - 1)); so once more than n - 1 - that rank requests exceed a limit, the percentile exceeds
    it whatever the rest do.  A request still waiting for its first token longer than the TTFT
    limit has already exceeded it; overload therefore ends a step within about one TTFT limit.
    Without a TTFT limit, a request that has waited longer than the step's whole arrival span
    (`max_wait_ms`) shows a queue that the server is not draining: the step is saturated.
    """

    def __init__(self, planned: int, limits: Mapping[str, tuple[str, float, float]],
                 max_wait_ms: float = math.inf) -> None:
        self.limits = list(limits.values())
        self.max_wait_ms = max_wait_ms
        self.saturated = False
        self.allowed = {(q, p): planned - 1 - math.floor(p / 100.0 * (planned - 1))
                        for q, p, _ in self.limits}
        self.over: dict[tuple[str, float], int] = {k: 0 for k in self.allowed}

    def done(self, per_request_ms: Mapping[str, float]) -> None:
        for q, p, limit in self.limits:
            if per_request_ms.get(q, 0.0) > limit:
                self.over[(q, p)] += 1

    def lost(self, waiting_ages_ms: Sequence[float] = ()) -> bool:
        if any(a > self.max_wait_ms for a in waiting_ages_ms):
            self.saturated = True
            return True
        for q, p, limit in self.limits:
            extra = sum(a > limit for a in waiting_ages_ms) if q in ("ttft", "e2el") else 0
            if self.over[(q, p)] + extra > self.allowed[(q, p)]:
                return True
        return False


@dataclass
class LoadStep:
    rate: float
    metrics: dict[str, float]
    passed: bool
    cut_short: bool
    saturated: bool
    cost_s: float       # server time the step took (simulated seconds on the simulator)
    sent: int
    fatal: bool = False  # the server died: no later step can run

    def row(self) -> dict[str, Any]:
        keep = ("p99_ttft_ms", "p99_tpot_ms", "request_throughput", "output_throughput")
        return {"rate": round(self.rate, 4), "passed": self.passed, "cut_short": self.cut_short,
                "saturated": self.saturated, "cost_s": round(self.cost_s, 3), "sent": self.sent,
                **{k: round(self.metrics[k], 3) for k in keep if k in self.metrics}}


@dataclass
class CapacityResult:
    capacity_rps: float
    steps: list[LoadStep] = field(default_factory=list)
    at_bound: bool = False   # max_rate itself passed: the capacity is at least this

    @property
    def cost_s(self) -> float:
        return sum(s.cost_s for s in self.steps)

    def record(self) -> dict[str, Any]:
        """What a trial stores (user attribute `capacity`) and the report draws."""
        return {"capacity_rps": self.capacity_rps, "at_bound": self.at_bound,
                "cost_s": round(self.cost_s, 3), "steps": [s.row() for s in self.steps]}


MeasureFn = Callable[[float], LoadStep]


def find_capacity(measure: MeasureFn, spec: CapacitySpec) -> CapacityResult:
    """Grow, then bisect; `measure(rate)` runs one load step on the running server.  A step
    that kills the server (`fatal`) ends the search: the capacity is the highest rate that passed
    before it, since a server that dies under a burst holds less than one that queues it."""
    steps: list[LoadStep] = []

    def run(rate: float) -> bool:
        steps.append(measure(rate))
        return steps[-1].passed

    if not run(spec.min_rate):
        return CapacityResult(0.0, steps)
    lo, hi = spec.min_rate, None
    while hi is None:
        rate = min(lo * spec.growth, spec.max_rate)
        if run(rate):
            lo = rate
            if rate >= spec.max_rate:
                return CapacityResult(lo, steps, at_bound=True)
        elif steps[-1].fatal:
            return CapacityResult(lo, steps)
        else:
            hi = rate
    while hi / lo > 1 + spec.resolution:
        mid = math.sqrt(lo * hi)
        if run(mid):
            lo = mid
        elif steps[-1].fatal:
            break
        else:
            hi = mid
    return CapacityResult(lo, steps)


def step_cell(cell: Cell, rate: float, n: int) -> Cell:
    """The cell one load step runs: `n` requests offered at `rate` per second with no client-side
    cap (a cap would queue them in the client and hide the server's queue from TTFT).  A trace
    keeps its arrival pattern, compressed or stretched to the rate's mean."""
    src = cell.source
    step = replace(cell, num_prompts=n, duration_s=None, concurrency=n, request_rate=rate)
    if isinstance(src, TraceSource):
        stamps = [e.timestamp_s or 0.0 for e in src.entries]
        span = stamps[-1] - stamps[0]
        if len(stamps) > 1 and span > 0:
            base = (len(stamps) - 1) / span * src.time_scale
            return replace(step, source=replace(src, time_scale=src.time_scale * rate / base),
                           request_rate=None)
        return replace(step, source=None)
    return step


def passes(metrics: Mapping[str, float], limits: Mapping[str, tuple[str, float, float]]) -> bool:
    return all(metrics.get(m, math.inf) <= limit for m, (_, _, limit) in limits.items())


def is_saturated(send_s: list[float], first_token_s: list[float | None]) -> bool:
    """Queue and TTFT growing without bound: the last quarter of requests waited more than
    twice as long for their first token as the first quarter, and more than half a second
    longer; a stable server's TTFT does not trend with time."""
    ttfts = [
        (f if f is not None else math.inf) - s for s, f in zip(send_s, first_token_s, strict=True)
    ]
    q = len(ttfts) // 4
    if q < 3:
        return False
    early = sorted(ttfts[:q])[q // 2]
    late = sorted(ttfts[-q:])[q // 2]
    return late > 2 * early and late - early > 0.5

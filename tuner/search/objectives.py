"""Objectives and SLO constraints: which aggregate metrics a study optimises, in which direction.

A failed server must still teach the sampler something, so an infeasible trial is told to
Optuna as COMPLETE with a positive constraint and the worst values we can honestly give: zero
throughput, and a latency ceiling no acceptable config reaches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tuner.errors import UsageError
from tuner.search.slo import SloTerm

DEFAULT_OBJECTIVES = ("max output_throughput", "min p99_ttft_ms", "min p99_tpot_ms")
WORST_LATENCY_MS = 600_000.0  # ten minutes: longer than any request we would accept

_METRIC_PREFIXES = ("mean_", "median_", "std_", "p50_", "p90_", "p99_")
_LATENCIES = ("ttft", "tpot", "itl", "e2el")
_THROUGHPUTS = ("output_throughput", "total_token_throughput", "request_throughput",
                "request_goodput", "capacity_rps")  # capacity_rps: tuner.bench.capacity


def known_metrics() -> list[str]:
    lat = [f"{p}{m}_ms" for m in _LATENCIES for p in _METRIC_PREFIXES]
    return [*_THROUGHPUTS, *lat]


def unit(metric: str) -> str:
    """The unit a metric is reported in, for labels: ms, tok/s or req/s."""
    if metric.endswith("_ms"):
        return "ms"
    if metric.startswith("request") or metric.endswith("_rps"):
        return "req/s"
    return "tok/s" if "throughput" in metric else ""


def check_metric(name: str, where: str) -> str:
    if name not in known_metrics():
        raise UsageError(f"{where}: unknown metric '{name}' (known: output_throughput, "
                         "total_token_throughput, request_throughput, capacity_rps, "
                         "{mean,median,p50,p90,p99}_"
                         "{ttft,tpot,itl,e2el}_ms)")
    return name


@dataclass(frozen=True)
class Objective:
    """One objective: the aggregate metric it names and whether bigger is better."""

    metric: str
    maximize: bool

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        return "maximize" if self.maximize else "minimize"

    @property
    def label(self) -> str:
        return f"{'max' if self.maximize else 'min'} {self.metric}"

    def __str__(self) -> str:
        return self.label

    def worst(self) -> float:
        return 0.0 if self.maximize else WORST_LATENCY_MS

    def value(self, metrics: Mapping[str, float]) -> float:
        return float(metrics.get(self.metric, self.worst()))


def parse_objectives(
    specs: list[str] | tuple[str, ...], where: str = "objectives"
) -> list[Objective]:
    """Parse entries like 'max output_throughput' or 'min p99_ttft_ms'."""
    out = []
    for spec in specs:
        parts = str(spec).split()
        if len(parts) != 2 or parts[0] not in ("max", "min"):
            raise UsageError(
                f"{where}: unknown objective '{spec}' (write 'max METRIC' or 'min METRIC')"
            )
        out.append(Objective(check_metric(parts[1], where), parts[0] == "max"))
    if not out:
        raise UsageError(f"{where}: at least one objective is needed")
    if len({o.metric for o in out}) != len(out):
        raise UsageError(f"{where}: an objective is listed twice")
    return out


def slo_violations(metrics: Mapping[str, float], slo: Mapping[str, float]) -> dict[str, float]:
    """Relative violation per SLO metric of a workload (each an upper limit): > 0 when missed.

    The workload's `slo:` is the `--slo` syntax's aggregate `metric <= limit`, so both are
    evaluated by `SloTerm.violation`; a missing metric counts as missed by 100%.
    """
    out = {}
    for metric, limit in slo.items():
        value = metrics.get(metric)
        out[metric] = 1.0 if value is None else SloTerm(metric, "<=", float(limit)).signed(value)
    return out

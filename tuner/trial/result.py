"""What one trial returns, and the cell loop every runner shares.

Why the loop lives here: a real server and the in-process simulator must stop a trial at the same
points (the first failed cell; a screening verdict), or benchmarks measure a different search than
users run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tuner.bench.records import Cell
from tuner.bench.runner import CellResult
from tuner.server.outcome import Outcome
from tuner.study.record import Stage

KeepGoing = Callable[[list[CellResult]], bool]


class HasMetrics(Protocol):
    @property
    def metrics(self) -> dict[str, float]: ...


@dataclass
class TrialResult:
    """One config's run: outcome, aggregate metrics, per-cell rows, and what the memory saw."""

    outcome: Outcome
    metrics: dict[str, float]
    cells: list[dict[str, Any]]
    argv: list[str]
    env: dict[str, str]
    wall_s: float
    stage: Stage = Stage.FULL
    idle_bytes: int | None = None            # memory in use once healthy, before any request
    ports_taken: int | None = None           # launches lost to a port another process took
    peak_bytes: int | None = None            # the memory high-water mark over the cells run
    sim_seconds: float | None = None         # simulated time of the cells (in-process runner)
    capacity_search: dict[str, Any] | None = None  # the load steps (tuner.bench.capacity)
    memory: dict[str, Any] | None = None     # the memory estimate's parts (trial.prescreen)
    predicted_peak_bytes: int | None = None
    capacity_bytes: int | None = None
    screen_metrics: dict[str, float] | None = None
    estimated: bool = False                  # metrics are full-matrix estimates (screened out)
    cell_order: list[str] | None = None
    repeats: list[dict[str, float]] | None = None
    first_run_metrics: dict[str, float] | None = None
    constraints: dict[str, float] = field(default_factory=dict)  # extra Optuna constraints


def median_metrics(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per metric, the median over runs of one config (the metrics every run recorded)."""
    keys = set.intersection(*(set(m) for m in runs))
    return {k: float(statistics.median(m[k] for m in runs)) for k in keys}


def more_runs(n: int, run: Callable[[int], TrialResult], failed: Callable[[int], str]
              ) -> tuple[list[TrialResult], TrialResult | None]:
    """Runs 1..n of one config (`run(i)`), stopping at the first that fails: (the healthy
    runs, that failed run with its reason prefixed by `failed(i)`, or None).  A config that
    dies one run in N is not one to deploy, so the caller records the failure as the
    config's outcome (a Pareto entrant's repeats, a pick's confirmation)."""
    done: list[TrialResult] = []
    for i in range(1, n + 1):
        res = run(i)
        if not res.outcome.feasible:
            return done, replace(res, outcome=Outcome(res.outcome.kind,
                                                      f"{failed(i)}: {res.outcome.reason}"))
        done.append(res)
    return done, None


def aggregate(cells: Sequence[HasMetrics]) -> dict[str, float]:
    """One set of figures for the whole matrix.

    Throughputs are totals over total time (a long cell weighs more, as on a real server);
    latency percentiles are the worst cell's (an SLO must hold in every cell); means are means.
    """
    done = [c for c in cells if c.metrics]
    if not done:
        return {}
    total_time = sum(c.metrics["duration"] for c in done)
    out: dict[str, float] = {"duration": total_time}
    for key in ("total_output_tokens", "total_input_tokens", "completed", "failed"):
        out[key] = sum(c.metrics.get(key, 0) for c in done)
    span = max(total_time, 1e-9)
    out["output_throughput"] = out["total_output_tokens"] / span
    out["total_token_throughput"] = (out["total_output_tokens"] + out["total_input_tokens"]) / span
    out["request_throughput"] = out["completed"] / span
    for key in done[0].metrics:
        if key.endswith("_ms"):
            vals = [c.metrics[key] for c in done if key in c.metrics]
            out[key] = max(vals) if not key.startswith("mean_") else sum(vals) / len(vals)
    return out


def cell_row(res: CellResult) -> dict[str, Any]:
    """A cell's result as stored with the trial (and in trials/<n>/cells.jsonl)."""
    c = res.cell
    return {"cell": {"concurrency": c.concurrency, "input_len": c.input_len,
                     "output_len": c.output_len, "num_prompts": c.num_prompts,
                     "duration_s": c.duration_s, "request_rate": c.request_rate, "key": c.key},
            "metrics": res.metrics, "error_class": res.error_class, "error": res.error,
            **({"peak_bytes": res.peak_bytes} if res.peak_bytes is not None else {})}


def drive(cells: Sequence[Cell], run_one: Callable[[int, Cell], CellResult],
          on_cell: Callable[[CellResult], None] | None = None,
          keep_going: KeepGoing | None = None) -> list[CellResult]:
    """Run cells in order until one fails (stress cells go first: the first failure decides the
    trial) or `keep_going(results so far)` says stop; returns the results."""
    results: list[CellResult] = []
    for i, cell in enumerate(cells):
        res = run_one(i, cell)
        results.append(res)
        if on_cell is not None:
            on_cell(res)
        if res.error_class is not None:
            break
        if keep_going is not None and i + 1 < len(cells) and not keep_going(results):
            break
    return results

"""Stress-first cell order and staged screening: spend the full matrix only on promising configs.

Why: a config that OOMs should do it in its first cell, not its last, and a config that cannot
beat what the study already has should not pay for the whole matrix.  Optuna cannot prune
multi-objective studies (`trial.report` / `should_prune` are single-objective only), so the
screening decision is ours:

1. cells run in the config's own stress order (largest estimated forward first: the biggest
   prefill at the highest concurrency with decodes running);
2. the first `screen_cells` cells are the screening subset;
3. the full matrix follows only if the config *could still enter the Pareto front*: its
   optimistic full-matrix values (screening values x the most favourable full/screen ratio seen
   in the study's fully-run trials, plus a slack) are not dominated by a fully-run feasible
   trial, and no SLO is certainly missed.

A screened-out config is told to Optuna as COMPLETE and feasible, with its *point estimate*
(screening values x the median full/screen ratio) and a record with stage 'screen',
screen_metrics (measured) and metrics (estimated).  Why this does not mislead the sampler: the
point estimate is no better than the optimistic one in any objective, and the optimistic one is
dominated by a measured trial; the front only ever moves forward, so a screened trial is never
on the final Pareto front and never selected, while the sampler still learns "mediocre here"
instead of "crashes here" (recording it as infeasible would push the search away from a region
that works).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from tuner.bench.records import Cell
from tuner.search.objectives import Objective
from tuner.study.pareto import on_front
from tuner.study.record import TrialRecord
from tuner.trial.memory_estimate import Estimate
from tuner.trial.result import aggregate

MIN_FULL_TRIALS = 3     # fully-run feasible trials needed before anything is screened out
RATIO_SLACK = 0.05      # widen the most favourable observed ratio by this much


def stress_order(cells: Sequence[Cell], est: Estimate) -> list[Cell]:
    """Cells by the estimate's forward bytes, largest first; ties: longer prompt, higher
    concurrency, then workload order (stable), so the order is deterministic."""
    forward = dict(est.cell_forwards)
    index = {id(c): i for i, c in enumerate(cells)}
    return sorted(cells, key=lambda c: (-forward.get(c.key, 0), -c.input_len, -c.concurrency,
                                        index[id(c)]))


def metrics_of_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Aggregate metrics of stored cell rows (`TrialResult.cells`), as `result.aggregate` does."""
    return aggregate([SimpleNamespace(metrics=r.get("metrics") or {}) for r in rows])


def _fully_run(t: TrialRecord) -> bool:
    return t.feasible and t.original


@dataclass(frozen=True)
class Verdict:
    go_on: bool
    reason: str
    estimate: dict[str, float]      # point estimate of the full-matrix metrics


def _ratios(trials: Sequence[TrialRecord], metric: str) -> list[float]:
    out = []
    for t in trials:
        full = t.metrics.get(metric)
        screen = (t.screen_metrics or {}).get(metric)
        if isinstance(full, (int, float)) and isinstance(screen, (int, float)) and screen > 0:
            out.append(full / screen)
    return out


def screen_verdict(screen: dict[str, float], trials: Sequence[TrialRecord],
                   objectives: Sequence[Objective], slo: Mapping[str, float]) -> Verdict:
    """Should a config whose screening cells gave `screen` run the rest of the matrix?"""
    full = [t for t in trials if _fully_run(t) and t.screen_metrics]
    if len(full) < MIN_FULL_TRIALS:
        return Verdict(True, f"fewer than {MIN_FULL_TRIALS} fully-run feasible trials", {})
    metrics = {o.metric for o in objectives} | set(slo)
    estimate = dict(screen)
    optimistic: dict[str, float] = {}
    for m in metrics:
        ratios = _ratios(full, m)
        if m not in screen or not ratios:
            return Verdict(True, f"no full/screen ratio for {m}", {})
        maximize = any(o.metric == m and o.maximize for o in objectives)
        best = max(ratios) * (1 + RATIO_SLACK) if maximize else min(ratios) * (1 - RATIO_SLACK)
        optimistic[m] = screen[m] * best
        estimate[m] = screen[m] * statistics.median(ratios)
    for m, limit in slo.items():
        if optimistic[m] > limit:
            return Verdict(False, f"misses the SLO {m} <= {limit:g} even optimistically "
                                  f"({optimistic[m]:.4g})", {**screen, **optimistic})
    opt_values = [optimistic[o.metric] for o in objectives]
    if not on_front(opt_values, full, objectives):
        return Verdict(
            False,
            "cannot enter the Pareto front: optimistic full-matrix values "
            + ", ".join(f"{o.metric}={optimistic[o.metric]:.4g}" for o in objectives)
            + " are dominated by a fully-run trial",
            estimate,
        )
    return Verdict(True, "could enter the Pareto front", estimate)

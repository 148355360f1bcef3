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
(screening values x the median full/screen ratio) and user_attrs stage='screen',
screen_metrics (measured) and metrics (estimated).  Why this does not mislead the sampler: the
point estimate is no better than the optimistic one in any objective, and the optimistic one is
dominated by a measured trial; the front only ever moves forward, so a screened trial is never
on the final Pareto front and never selected, while the sampler still learns "mediocre here"
instead of "crashes here" (recording it as infeasible would push the search away from a region
that works).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.bench.records import Cell
from tuner.trial.memory_estimate import Knobs, cell_forward_bytes
from tuner.search.model import ModelInfo
from tuner.search.objectives import Objective
from tuner.trial.run import aggregate

MIN_FULL_TRIALS = 3     # fully-run feasible trials needed before anything is screened out
RATIO_SLACK = 0.05      # widen the most favourable observed ratio by this much


def stress_order(cells: Sequence[Cell], model: ModelInfo, knobs: Knobs) -> list[Cell]:
    """Cells by estimated forward bytes, largest first; ties: longer prompt, higher concurrency,
    then workload order (stable), so the order is deterministic."""
    index = {id(c): i for i, c in enumerate(cells)}
    return sorted(cells, key=lambda c: (-cell_forward_bytes(model, knobs, c), -c.input_len,
                                        -c.concurrency, index[id(c)]))


def metrics_of_rows(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Aggregate metrics of stored cell rows (`TrialResult.cells`), as `trial.aggregate` does."""
    return aggregate([SimpleNamespace(metrics=r.get("metrics") or {}) for r in rows])


def is_full_feasible(t: FrozenTrial) -> bool:
    """A trial that ran the whole matrix healthy and met every constraint."""
    return (t.state == TrialState.COMPLETE and t.values is not None
            and t.user_attrs.get("outcome") == "ok" and t.user_attrs.get("stage", "full") == "full"
            and "cached_from" not in t.user_attrs
            and all(v <= 0 for v in t.constraints.values()))


def dominates(a: Sequence[float], b: Sequence[float], objectives: Sequence[Objective]) -> bool:
    """a is at least as good as b everywhere and better somewhere."""
    better = False
    for x, y, o in zip(a, b, objectives):
        gx, gy = (x, y) if o.direction == "maximize" else (-x, -y)
        if gx < gy:
            return False
        better = better or gx > gy
    return better


def on_front(values: Sequence[float], trials: Sequence[FrozenTrial],
             objectives: Sequence[Objective]) -> bool:
    """Would `values` be non-dominated among the fully-run feasible trials?"""
    return not any(dominates(t.values, values, objectives) for t in trials if is_full_feasible(t))


@dataclass(frozen=True)
class Verdict:
    go_on: bool
    reason: str
    estimate: dict[str, float]      # point estimate of the full-matrix metrics


def _ratios(trials: Sequence[FrozenTrial], metric: str) -> list[float]:
    out = []
    for t in trials:
        full = (t.user_attrs.get("metrics") or {}).get(metric)
        screen = (t.user_attrs.get("screen_metrics") or {}).get(metric)
        if isinstance(full, (int, float)) and isinstance(screen, (int, float)) and screen > 0:
            out.append(full / screen)
    return out


def screen_verdict(screen: dict[str, float], trials: Sequence[FrozenTrial],
                   objectives: Sequence[Objective], slo: dict[str, float]) -> Verdict:
    """Should a config whose screening cells gave `screen` run the rest of the matrix?"""
    full = [t for t in trials if is_full_feasible(t) and t.user_attrs.get("screen_metrics")]
    if len(full) < MIN_FULL_TRIALS:
        return Verdict(True, f"fewer than {MIN_FULL_TRIALS} fully-run feasible trials", {})
    metrics = {o.metric for o in objectives} | set(slo)
    estimate = dict(screen)
    optimistic: dict[str, float] = {}
    for m in metrics:
        ratios = _ratios(full, m)
        if m not in screen or not ratios:
            return Verdict(True, f"no full/screen ratio for {m}", {})
        maximize = any(o.metric == m and o.direction == "maximize" for o in objectives)
        best = max(ratios) * (1 + RATIO_SLACK) if maximize else min(ratios) * (1 - RATIO_SLACK)
        optimistic[m] = screen[m] * best
        estimate[m] = screen[m] * statistics.median(ratios)
    for m, limit in slo.items():
        if optimistic[m] > limit:
            return Verdict(False, f"misses the SLO {m} <= {limit:g} even optimistically "
                                  f"({optimistic[m]:.4g})", {**screen, **optimistic})
    opt_values = [optimistic[o.metric] for o in objectives]
    if not on_front(opt_values, full, objectives):
        return Verdict(False, "cannot enter the Pareto front: optimistic full-matrix values "
                              + ", ".join(f"{o.metric}={optimistic[o.metric]:.4g}" for o in objectives)
                              + " are dominated by a fully-run trial", estimate)
    return Verdict(True, "could enter the Pareto front", estimate)

"""Pareto dominance over a study's objectives: the one rule that staging and selection share."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.search.objectives import Objective
from tuner.study.record import TrialRecord


def dominates(a: Sequence[float], b: Sequence[float], objectives: Sequence[Objective]) -> bool:
    """a is at least as good as b in every objective and better in one."""
    better = False
    for x, y, o in zip(a, b, objectives):
        gx, gy = (x, y) if o.maximize else (-x, -y)
        if gx < gy:
            return False
        better = better or gx > gy
    return better


def front(trials: Sequence[TrialRecord], objectives: Sequence[Objective]) -> list[TrialRecord]:
    """The non-dominated trials (by their values), in trial-number order."""
    done = [(t, t.values) for t in trials if t.values is not None]
    return sorted((t for t, v in done
                   if not any(dominates(w, v, objectives) for o, w in done if o is not t)),
                  key=lambda t: t.number)


def on_front(values: Sequence[float], trials: Sequence[TrialRecord],
             objectives: Sequence[Objective]) -> bool:
    """Would `values` be non-dominated among the feasible, originally run trials?"""
    return not any(dominates(t.values, values, objectives)
                   for t in trials if t.feasible and t.original and t.values)

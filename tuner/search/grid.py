"""A grid over a search space, for `--sampler grid` (the baseline every tuner is compared with).

Why: vLLM's auto_tune and most hand tuning sweep a grid; our benchmark measures against one.
Each numeric knob gets `points` values spread over its range (geometrically for `log: true`,
snapped to its step), each categorical or bool knob all its values.  Optuna's GridSampler
visits the grid in a seeded random order, so a budget smaller than the grid is a random subset.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.search.space import Param, SearchSpace

DEFAULT_POINTS = 3


def axis(p: Param, points: int = DEFAULT_POINTS) -> list[Any]:
    """The grid values of one knob, sorted, without duplicates."""
    if p.type == "bool":
        return [False, True]
    if p.type == "categorical":
        return list(p.choices)
    lo, hi = float(p.low), float(p.high)
    if points <= 1 or lo == hi:
        raw = [lo]
    elif p.log:
        raw = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (points - 1))
               for i in range(points)]
    else:
        raw = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    if p.step:
        raw = [lo + round((v - lo) / p.step) * p.step for v in raw]
    values = [int(round(v)) if p.type == "int" else v for v in raw]
    values = [min(max(v, p.low), p.high) for v in values]
    return sorted(set(values))


def grid_space(space: SearchSpace, points: int = DEFAULT_POINTS) -> dict[str, list[Any]]:
    """{knob: values} for optuna.samplers.GridSampler."""
    return {p.name: axis(p, points) for p in space.parameters}


def grid_size(grid: dict[str, list[Any]]) -> int:
    return math.prod(len(v) for v in grid.values())

"""A grid over a search space, for `--sampler grid` (the baseline every tuner is compared with).

Why: vLLM's auto_tune and most hand tuning sweep a grid; our benchmark measures against one.
Each numeric knob gets `points` values spread over its range (geometrically for `log: true`,
snapped to its step), each categorical or bool knob all its values, and the server default's
value joins its knob's axis, so that the default is a grid point and never run twice.
`tuner.study.sampler.enqueue_grid` queues the points in a seeded order, so a budget smaller than
the grid is a random subset.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from tuner.search.space import Param, SearchSpace

DEFAULT_POINTS = 3


def axis(p: Param, points: int = DEFAULT_POINTS) -> list[Any]:
    """The grid values of one knob, sorted, without duplicates."""
    if p.type == "bool":
        return [False, True]
    if p.type == "categorical":
        return list(p.choices)
    lo, hi = p.bounds
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
    values = [min(max(v, lo), hi) for v in values]
    return sorted(set(values))


def grid_space(space: SearchSpace, points: int = DEFAULT_POINTS,
               include: Mapping[str, Any] | None = None) -> dict[str, list[Any]]:
    """{knob: values}; each knob's value in `include` (the server default) joins its axis."""
    grid = {p.name: axis(p, points) for p in space.parameters}
    for name, value in (include or {}).items():
        if name in grid and value not in grid[name]:
            grid[name] = sorted([*grid[name], value])
    return grid


def complete_on_grid(space: SearchSpace, params: Mapping[str, Any],
                     points: int = DEFAULT_POINTS) -> dict[str, Any]:
    """`params` with every knob it lacks set to that knob's first grid value: a grid point."""
    return {p.name: params[p.name] if p.name in params else axis(p, points)[0]
            for p in space.parameters}


def grid_configs(space: SearchSpace, points: int = DEFAULT_POINTS,
                 include: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every point of the grid as a config, in axis order."""
    grid = grid_space(space, points, include)
    names = list(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]


def grid_size(grid: dict[str, list[Any]]) -> int:
    return math.prod(len(v) for v in grid.values())

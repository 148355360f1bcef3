"""Trial 0: the server's default config, its KV pool lowered until it fits the card.

Why: the server's default is the natural first trial (what a user runs today), but its pool
is often sized for another card: on a smaller card it cannot start, the first trial is
wasted, and the study has nothing to calibrate its memory model on.  So the pool is lowered
until the config fits with the high-end runtime allowance, and the default is queued as that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.bench.records import Cell
from tuner.search.model import ModelInfo
from tuner.search.space import SearchSpace
from tuner.trial.kv_share import KV_ROLES, largest
from tuner.trial.memory_estimate import (
    RUNTIME_HIGH_BYTES,
    estimate,
    knobs_from_params,
    runtime_prior,
)


def runnable(space: SearchSpace, model: ModelInfo, capacity: int, cells: Sequence[Cell],
             params: dict[str, Any]) -> dict[str, Any]:
    """`params` with the KV knob lowered until the config fits with the high-end runtime
    allowance: trial 0 must run, or the study starts with nothing to calibrate on.  Unchanged
    without a KV knob value (the server sizes its own pool) or when it already fits."""
    p = next((q for q in space.parameters if q.role in KV_ROLES), None)
    if p is None or params.get(p.name) is None:
        return params

    def fits(value: int) -> bool:
        knobs = knobs_from_params(space, {**params, p.name: value})
        runtime = RUNTIME_HIGH_BYTES + runtime_prior(knobs.cuda_graph) - runtime_prior(False)
        return estimate(model, knobs, list(cells), runtime=runtime).need <= capacity

    low, step = int(p.bounds[0]), int(p.step or 1)
    value = int(params[p.name])
    if fits(value):
        return params
    if not fits(low):  # the pool is not what overflows: the smallest one is the nearest
        return {**params, p.name: low}
    n = largest(lambda i: fits(low + i * step), (value - low) // step)
    return {**params, p.name: low + n * step}


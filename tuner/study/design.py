"""The start-up design: while the sampler has no model yet, every number is drawn from a Latin
hypercube on its own scale and the KV share from the upper half of the headroom.

Why a Latin hypercube: the first trials must show the model where each knob's good end is.
Independent uniform draws cluster: on a log range such as a batch cap in [1, 128] a quarter of
them land at 3 or less, and with four cap-like knobs most start-up configs have some degenerate
cap that meets no SLO or runs at a few percent of the best (benchmarks/search_efficiency.py,
Qwen2.5-7B / L40S).  A Latin hypercube over the start-up length puts exactly one draw per knob
in each of its strata.  Fixed levels were measured against it (median of 10 seeds at 20
trials, 8B / RTX 4090 and Qwen): three levels per number (both ends, the middle) 0.97 and
0.71, five levels 0.91 and 0.65, the hypercube 0.88 and 0.80.  Levels put a fifth to a third
of every knob at its lower end; the hypercube is the design that did not fail a scenario.

Why the upper half of the share: a pool under half of what fits is rarely the best one.  The
throughput rises with the pool while the batch is KV-bound and is flat after, and a share above
the real edge is not wasted either: its OOM calibrates the edge (`tuner.trial.kv_share`).
"""

from __future__ import annotations

import math
import random
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.study.record import KV_SHARE

SHARE_FLOOR = 0.5               # start-up KV shares are drawn from [SHARE_FLOOR, 1]


def level(dist: IntDistribution | FloatDistribution, position: float) -> Any:
    """The value at `position` in [0, 1] of the range, on its log or linear scale, on its step."""
    low, high = float(dist.low), float(dist.high)
    if dist.log:
        value = math.exp(math.log(low) + position * (math.log(high) - math.log(low)))
    else:
        value = low + position * (high - low)
    step = dist.step
    if step is not None:
        value = low + round((value - low) / step) * step
    value = min(high, max(low, value))
    return int(round(value)) if isinstance(dist, IntDistribution) else value


class StartupDesign:
    """Draws of a Latin hypercube of `size` points: each knob's strata are used once, in an
    order of their own, before any is used again (rejected candidates use them up too)."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self._size = max(2, size)
        self._rng = rng
        self._strata: dict[str, list[int]] = {}

    def _position(self, name: str) -> float:
        left = self._strata.get(name)
        if not left:
            left = self._strata[name] = self._rng.sample(range(self._size), self._size)
        return (left.pop() + self._rng.random()) / self._size

    def draw(self, name: str, dist: BaseDistribution) -> Any:
        """One start-up value of knob `name` (see module doc)."""
        if isinstance(dist, CategoricalDistribution):
            choices = dist.choices
            return choices[min(len(choices) - 1, int(self._position(name) * len(choices)))]
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        if name == KV_SHARE:
            low = max(SHARE_FLOOR, dist.low)
            return low + self._position(name) * (dist.high - low)
        return level(dist, self._position(name))

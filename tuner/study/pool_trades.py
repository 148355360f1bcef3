"""Pool trades: the incumbent with one number lowered a step where that frees memory for a
larger KV pool.

Why: an incumbent can sit on a plateau where its pool is capped by the memory its own forward
needs, not by the card.  On the 8B / RTX 4090 scenario of benchmarks/search_efficiency.py, 5
of 20 seeds ended 30 trials at 0.65-0.68 of the best.  In one, the incumbent ran a 16.8k-token
prefill budget and a prefill cap of 15 beside a 9.2k-token pool; a TPE draw with a 6k budget
and a cap of 8 held 13.3k tokens and ran at 1.00.  Random neighbours move one or two of a
dozen knobs, either way, so they rarely make that move.  The memory model knows which knob's
forward holds the pool down: the trade lowers the number whose step (`STEP_SCALE` of its range)
raises the pool most, at the incumbent's share of the new edge, if that is by more than
`EDGE_TOL`.  The run then says whether the pool pays for what the lower setting costs.  One
trade per incumbent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from tuner.study.local_moves import STEP_SCALE, shift
from tuner.study.record import KV_SHARE, TrialRecord
from tuner.trial.kv_share import EDGE_TOL, KvEdge


def pool_trade(top: TrialRecord, space: Mapping[str, BaseDistribution], edge: KvEdge | None,
               trials: Sequence[TrialRecord]) -> dict[str, Any] | None:
    """The incumbent `top` (as params over `space`) with the one number lowered that gives
    the largest pool (see module doc); None without a KV edge, without such a number, or
    once a trial has run `top` with one number lowered."""
    if edge is None or KV_SHARE not in space or edge.param.name not in top.params:
        return None
    numbers = [n for n, d in space.items() if n != KV_SHARE and not d.single()
               and isinstance(d, (IntDistribution, FloatDistribution)) and n in top.params]
    if any(_lowered(t.params, top.params, numbers, edge.param.name)
           for t in trials if not t.unmeasured):
        return None
    base = {k: top.params[k] for k in space}
    rest = {k: v for k, v in base.items() if k != KV_SHARE}
    pool = int(top.params[edge.param.name])
    best, gain = None, EDGE_TOL
    for name in numbers:
        lower = shift(base[name], space[name], -STEP_SCALE)
        if lower == base[name]:
            continue
        grown = edge.value({**rest, name: lower}, float(base[KV_SHARE]), trials) / pool - 1
        if grown > gain:
            best, gain = {**base, name: lower}, grown
    return best


def _lowered(params: Mapping[str, Any], top: Mapping[str, Any], numbers: Sequence[str],
             kv_name: str) -> bool:
    """Whether `params` is `top` with exactly one of `numbers` lower (the pool aside)."""
    diff = [n for n in set(params) | set(top)
            if n not in (KV_SHARE, kv_name) and params.get(n) != top.get(n)]
    return len(diff) == 1 and diff[0] in numbers and params[diff[0]] < top[diff[0]]

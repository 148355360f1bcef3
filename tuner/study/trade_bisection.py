"""A trade that missed the SLOs with a better objective than the incumbent: a request cap that
binds at its pool opened, then the number it lowered bisected between the lowest value that met
the SLOs and the highest below it that missed them, at the incumbent's share of each value's
edge.

Why: a pool trade (`tuner.study.pool_trades`) lowers a number to free memory for a larger pool,
and the larger pool holds a larger batch.  Where an SLO is missed by what a larger batch costs
(a per-token latency: a decode step of more requests is slower), the best config sits where the
SLO cuts the trade line, between the two runs, and neither run's neighbours look there.  On
Llama-3.1-8B / RTX 3090 (24 requests of 2k-token prompts with 768-token answers beside chat,
p99 TPOT <= 25 ms; benchmarks/search_scenarios.py, w-8b-3090-tpot) an incumbent with a 6.0k
prefill budget held 10.9k tokens at 197 tok/s; its trade to a 2.5k budget held 15.4k tokens at
270 tok/s and missed p99 TPOT by 27%; a 5.4k budget holds 11.4k tokens at 237.5 tok/s within
the SLO, and in the study's 10 turns after the trade no run had a budget between 3.0k and 6.0k.
Along the line the SLO's metric rises as the number falls (the pool grows, and a smaller budget
splits a prompt's prefill over more steps), so a bisection finds the cut in a few runs: a run
that meets the SLOs there becomes the incumbent and narrows the bracket from above, one that
misses narrows it from below.  A value at which the calibrated model holds no larger pool than
at the value that met is that run again, and is passed over for the middle of the lower half.
The bracket is not split once it is narrower than 2**-`SPLITS` of the number's range (on its
log or linear scale): each split costs a run.

Why a request cap of the missed trade is opened first: the larger pool admits more requests
than the incumbent's caps were ever asked to hold, and a cap that holds requests back makes them
miss a per-token SLO whatever the traded number is.  In another seed of that scenario (2) the
trade to a 6.0k budget held 10.9k tokens at 193 tok/s against the incumbent's 143 and missed
p99 TPOT by 35% with a running-batch cap of 14 beside 24 long requests; opened to 48, it met the
SLO at 197.  Bisecting the budget instead had run five configs between 6.0k and 13k, each at
the incumbent's pool (before middles that hold no larger pool were passed over).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from tuner.study.design import level
from tuner.study.local_moves import position
from tuner.study.open_caps import cap_targets, opened_caps, untested
from tuner.study.pool_trades import trade_runs
from tuner.study.record import KV_SHARE, TrialRecord
from tuner.trial.kv_share import EDGE_TOL, KvEdge

SPLITS = 6   # a bracket narrower than 1/64 of the number's range is not split again


def bisected(top: TrialRecord, space: Mapping[str, BaseDistribution], edge: KvEdge | None,
             trials: Sequence[TrialRecord], sign: float) -> list[dict[str, Any]]:
    """For each trade of `top` that missed the SLOs and beat it, the latest first: the trade
    with one request cap that binds at its pool opened (`tuner.study.open_caps.opened_caps`),
    then `top` (as params over `space`) with the traded number halfway into the bracket (see
    module doc).  `sign`: 1 where the first objective is maximised."""
    out: list[dict[str, Any]] = []
    if edge is None or KV_SHARE not in space or top.values is None:
        return out
    kv = edge.param.name
    best = sign * top.values[0]
    base = {k: top.params[k] for k in space}
    rest = {k: v for k, v in base.items() if k != KV_SHARE}
    share = float(base[KV_SHARE])
    for miss in reversed(trade_runs(top, space, kv, trials)):
        if miss.outcome != "slo" or not miss.original or miss.values is None \
                or sign * miss.values[0] <= best:
            continue
        caps = cap_targets(edge.space, miss.params, edge.cells)
        out += untested(opened_caps(miss.params, caps, space), trials, kv)
        name = next(k for k in space if k not in (KV_SHARE, kv)
                    and miss.params.get(k) != top.params.get(k))
        dist = space[name]
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        line = [t for t in trials if t.values is not None and t.original
                and _on_line(t.params, top.params, name, kv)]
        high = min(t.params[name] for t in line if t.feasible)
        below = [t.params[name] for t in line if t.outcome == "slo" and t.params[name] < high]
        if not below:
            continue
        lo, hi = position(max(below), dist), position(high, dist)
        pool = edge.value({**rest, name: high}, share, trials)
        upper = high
        while hi - lo >= 2.0 ** -SPLITS:
            mid = level(dist, (lo + hi) / 2)
            if not max(below) < mid < upper:
                break
            if edge.value({**rest, name: mid}, share, trials) > pool * (1 + EDGE_TOL):
                out.append({**base, name: mid})
                break
            upper, hi = mid, position(mid, dist)   # frees nothing by the model: as `high`
    return out


def _on_line(params: Mapping[str, Any], top: Mapping[str, Any], name: str, kv: str) -> bool:
    """Whether `params` is `top` but for `name` (the pool aside)."""
    return all(params.get(k) == v for k, v in top.items() if k not in (KV_SHARE, kv, name)) \
        and name in params

"""Neighbours of the incumbent: the exploitation half of the proposals once the model has data.

Why: TPE samples from a density over the good trials, which finds the right region quickly but
then circles it: in the benchmark's 8B / RTX 4090 scenario the last 15 of 40 trials sat within
a few percent of the optimum without reaching it, and a knob whose early tries all failed (CUDA
graphs beside a tight pool) is never tried again once the good trials agree on the other value.
The seed's team finished their search the other way: from the best config so far, one knob at
a time.  A neighbour changes one or two knobs of an incumbent (a Pareto-optimal feasible
trial): a categorical takes another choice, a number moves by a random step on its own scale
(log or linear), at most a quarter of its range, never zero.

Why pattern moves: where throughput keeps rising along a direction (batch caps up to the
workload's concurrency on Qwen2.5-7B / L40S), random one-or-two-knob steps of at most a quarter
of a range climb slowly: seeds ended 30 trials at 0.73-0.82 of the best with the caps at half
their useful value.  After each improvement the step that made it is tried once more.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection

from tuner.study.record import KV_SHARE, TrialRecord, config_key
from tuner.study.step_shape import behaviour_key
from tuner.trial.kv_share import EDGE_TOL, KvEdge

MAX_CHANGES = 2
STEP_SCALE = 0.25   # the largest move of a number, as a share of its range (log or linear)


def incumbents(trials: Sequence[TrialRecord],
               directions: Sequence[StudyDirection]) -> list[TrialRecord]:
    """The feasible, fully measured trials no other such trial dominates."""
    done = [t for t in trials if t.feasible and t.original and t.values is not None]
    sign = [1.0 if d == StudyDirection.MAXIMIZE else -1.0 for d in directions]

    def better(a: TrialRecord, b: TrialRecord) -> bool:
        pairs = [(s * x, s * y) for s, x, y in zip(sign, a.values or (), b.values or ())]
        return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)
    return [t for t in done if not any(better(o, t) for o in done if o is not t)]


def inert_knobs(trials: Sequence[TrialRecord], names: Sequence[str]) -> set[str]:
    """Knobs whose change alone left every objective value equal (to 1e-9): two measured
    configs that differ in that knob only.  Moving such a knob measures the same config again;
    on a real server noise keeps any two runs apart, so this only fires on a deterministic
    one (the simulator), where the budget would otherwise go to exact repeats."""
    runs = [t for t in trials if t.outcome in ("ok", "slo") and t.original and t.values]
    out: set[str] = set()
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            # over the configs as run: the rendered KV pool counts, the sampler's share does not
            # (a pool matters only once it limits the batch: it is never called inert)
            keys = (set(a.params) | set(b.params)) - {KV_SHARE}
            diff = [n for n in keys if a.params.get(n) != b.params.get(n)]
            same = all(math.isclose(x, y, rel_tol=1e-9)
                       for x, y in zip(a.values or (), b.values or ()))
            if len(diff) == 1 and diff[0] in names and same:
                out.add(diff[0])
    return out


def _move(value: Any, dist: BaseDistribution, rng: random.Random) -> Any:
    if isinstance(dist, CategoricalDistribution):
        others = [c for c in dist.choices if c != value]
        return rng.choice(others) if others else value
    return shift(value, dist, rng.uniform(0.02, STEP_SCALE) * rng.choice((-1.0, 1.0)))


def shift(value: Any, dist: BaseDistribution, step: float) -> Any:
    """A number moved by `step` (a signed share of its range, on its log or linear scale),
    clipped to the range; an int moves at least one grid step the same way."""
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    low, high = float(dist.low), float(dist.high)
    if high <= low:
        return value
    if dist.log:
        new = math.exp(math.log(float(value)) + step * (math.log(high) - math.log(low)))
    else:
        new = float(value) + step * (high - low)
    new = min(high, max(low, new))
    if isinstance(dist, IntDistribution):
        q = dist.step
        n = round((new - low) / q)
        if low + n * q == value:  # a move too small for the grid: one step the same way
            n += 1 if step > 0 else -1
        return int(min(high, max(low, low + n * q)))
    if dist.step is not None:  # off its grid, Optuna would silently draw another value
        return min(high, max(low, low + round((new - low) / dist.step) * dist.step))
    return new


def neighbour(params: Mapping[str, Any], space: Mapping[str, BaseDistribution],
              rng: random.Random, inert: Collection[str] = ()) -> dict[str, Any]:
    """`params` (restricted to `space`) with one or two knobs moved, not the `inert` ones."""
    out = {k: params[k] for k in space if k in params}
    movable = [k for k in out if not space[k].single() and k not in inert]
    for name in rng.sample(movable, min(len(movable), rng.randint(1, MAX_CHANGES))):
        out[name] = _move(out[name], space[name], rng)
    return out


def pattern_move(trials: Sequence[TrialRecord], directions: Sequence[StudyDirection],
                 space: Mapping[str, BaseDistribution]) -> dict[str, Any] | None:
    """The last improvement repeated: the newest best config moved again by the step that
    made it (Hooke and Jeeves' pattern move), numbers only; None without two improvements or
    with several objectives."""
    if len(directions) != 1:
        return None
    sign = 1.0 if directions[0] == StudyDirection.MAXIMIZE else -1.0
    bests: list[TrialRecord] = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.feasible and t.original and t.values and (
                not bests or sign * t.values[0] > sign * (bests[-1].values or (0.0,))[0]):
            bests.append(t)
    if len(bests) < 2:
        return None
    new, old = bests[-1].params, bests[-2].params
    if not all(k in new and k in old for k in space):
        return None
    out = {k: new[k] for k in space}
    for name, dist in space.items():
        if isinstance(dist, (IntDistribution, FloatDistribution)) and new[name] != old[name]:
            out[name] = shift(new[name], dist, position(new[name], dist)
                              - position(old[name], dist))
    return out


def position(value: Any, dist: IntDistribution | FloatDistribution) -> float:
    """Where `value` sits in its range, 0 to 1, on the knob's log or linear scale."""
    low, high = float(dist.low), float(dist.high)
    if high <= low:
        return 0.0
    if dist.log:
        return (math.log(float(value)) - math.log(low)) / (math.log(high) - math.log(low))
    return (float(value) - low) / (high - low)


def distinct(tops: list[TrialRecord], kv_name: str | None) -> list[TrialRecord]:
    """The incumbents, of several with equal values only one: a copy of the best config at a
    pool that made no difference is not a second place to search from.  The one with the
    largest pool, else the first: its flips run at that pool, where a choice that needs room
    for more requests shows what it is worth."""
    out: dict[tuple[float, ...], TrialRecord] = {}
    for t in sorted(tops, key=lambda t: (-int(t.params.get(kv_name) or 0) if kv_name else 0,
                                         t.number)):
        out.setdefault(tuple(t.values or ()), t)
    return sorted(out.values(), key=lambda t: t.number)


def fresh_in(trials: Sequence[TrialRecord],
             edge: KvEdge | None) -> Callable[..., bool]:
    """`fresh(cand, fits, pool=None)`: whether a candidate fits by `fits` (a config's slack:
    >= 0 where it can fit) and renders to a config not run yet (its KV share rendered to its
    pool: two shares can be one pool or two pools; a flip's pool is pinned instead: `pool`).
    A pool within `EDGE_TOL` of one its knobs ran at is that run again: the model's edge moves
    a little with each run, so one share renders a few blocks apart from turn to turn, and
    on the Qwen2.5-7B / RTX 3090 decode scenario of benchmarks/search_efficiency.py (round
    31, seed 3) a 40-trial study spent its last seven turns on one config at 38.0k-38.9k
    tokens, each a pool not run yet, all at 887-890 tok/s.  So are knobs that leave what a
    step can hold in every cell as it was (`tuner.study.step_shape.behaviour_key`): on the
    Mistral-7B / A100 80 GB scenario (round 33, seed 6) five of a 30-trial study's last ten
    turns were a prefill cap opened beside a token budget that held two prompts, or a
    long-context threshold or total-length flag that called no prompt long either way, each
    measuring its run again to the token."""
    seen = {config_key(t.params) for t in trials}
    name = edge.param.name if edge is not None else None

    def behaviour(params: Mapping[str, Any]) -> str:
        assert edge is not None and name is not None
        return behaviour_key(edge.space, params, edge.cells, name)
    pools: dict[str, list[int]] = {}
    for t in trials:
        if name is not None and name in t.params:
            pools.setdefault(behaviour(t.params), []).append(int(t.params[name]))

    def fresh(cand: dict[str, Any], fits: Callable[[dict[str, Any]], float],
              pool: int | None = None) -> bool:
        full = cand
        if edge is not None and KV_SHARE in cand:
            rest = {k: v for k, v in cand.items() if k != KV_SHARE}
            full = {**rest, edge.param.name: pool if pool is not None
                    else edge.value(rest, cand[KV_SHARE], trials)}
        if name is not None and name in full:
            value = int(full[name])
            if any(abs(value - ran) <= EDGE_TOL * max(value, ran)
                   for ran in pools.get(behaviour(full), ())):
                return False
        return config_key(full) not in seen and fits(cand) >= 0
    return fresh

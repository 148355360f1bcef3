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
`EDGE_TOL` (a pool counted only up to what holds the workload's peak demand:
`KvEdge.within_demand`).  The run then says whether the pool pays for what the lower setting
costs.  One trade per incumbent.

Why a number whose step frees nothing is lowered on to the least move that frees: the
estimate's forward changes by forms (a prefill of three prompts, then of two), so the pool a
number holds down moves in steps, and one step of the number can free nothing where a longer
move frees much.  On Llama-3.1-8B / RTX 3090 (24 requests of 2k-token prompts with 768-token
answers beside chat, p99 TPOT <= 25 ms; benchmarks/search_scenarios.py, w-8b-3090-tpot) the
incumbents held a 15.5k-token prefill budget beside a 7.8-8.4k-token pool: one more prompt's
room (8.5k tokens) lets the estimate batch three 2k-token prompts' prefill, 1.2 GiB more forward
than two.  The budget's step (to 6.5k) still batches three, so there was no trade, and 7 of 10
seeds ended 40 trials at 0.60 of the best known.  So where no number's step frees more than
`EDGE_TOL`, the number that must move least to do so (`reliefs`: a bisection on the calibrated
model) is lowered that far: in two of those seeds a 6.0k budget, 10.9k tokens, 0.83 of the
best (benchmarks/results/search_efficiency.md, round 47).

Why a trade is run again at its own edge: the model puts the traded config's pool where its
forward, scaled as the incumbent's measured, leaves room, and that guess can be short.  On the
fresh Mistral-7B / RTX 4090 scenario a trade of a 21.9k-token prefill budget to 9.2k ran a
21.5k-token pool, the model's edge; the config's real edge was about 24.6k, and only from 22.5k
on does the pool hold the chat cell's 48 requests: the trade measured 0.2% less than the
incumbent, and the seed stayed at 0.86 of the best from trial 20 to 40.  The trade's own run
measured its forward, so its edge is now the model's best guess: a trade that met the SLOs
below that edge (by more than `EDGE_TOL`) is run there (`trades_of`), before any other move of
the incumbent's numbers.

Why a trade that ran out of memory runs again halfway back to the incumbent's pool: the
model's freed memory can be wrong by much more than `EDGE_TOL`, and once the trade had run, it
was never proposed again.  On w-8b-3090-tpot (seed 8) a trade of a 32.5k budget to 6.0k was
put at 12.8k tokens and ran out of memory; run again at the model's corrected edge, 11.9k, it
ran out again; the config runs at 10.8k (197 tok/s beside the incumbent's 143).  Lowering one
number never needs more memory, so the trade fits at the incumbent's pool: halfway between
that and the OOM is a bisection of the trade's real edge, and `trades_of` carries it on from a
healthy run.
Once, per trade: a second OOM of those knobs leaves it to the edge pushes.

Why reliefs: a categorical flip that ran out of memory (CUDA graphs, whose captured batches hold
memory of their own) was paired only with other categoricals (`tuner.study.flips.companions`),
while what held its memory down was a number.  On Llama-3.1-70B / H200 the graph flip of an
incumbent with an 18.5k-token prefill budget ran out of memory at the smallest pool, then with
each block size, decode-first and prefix caching in turn: 11 OOMs in one study; graphs ran
healthy in one study of ten, although graphs with a 2k budget ran 2.5% faster than any config
found.  A relief is the flip with one number lowered to the largest value at which the
calibrated memory model says it fits: at the incumbent's pool where some value does, else at
the smallest pool.  The model has just been corrected by the flip's OOM, and a relief that runs
out of memory corrects it again, so the next relief lowers further.  Measured on 20 seeds
(benchmarks/search_ab.py), with the companions the model says cannot fit no longer tried: on
70B, OOM launches after the first 5 trials 10.6% -> 8.3%, mean best at 30 / 40 trials
.965 / .967 -> .968 / .970; the other scenarios identical seed by seed.

Why a flip the model rules out gets the same treatment, and why the floor relief: in most
Llama-3.1-70B / H200 studies the graph flip was never launched at all.  Graph configs of the
start-up design had run out of memory (in one seed: at 5695 tokens, and at 4993 with a 1.4k
prefill budget, 2.6% above the smallest pool), the model put the shortfall in the graph
runtime, and then said graphs fit at no pool with any one number lowered: no relief.  Yet
graphs with a 1-4k prefill budget at the smallest pool run at 80.4-80.6 tok/s, against the
78.5 of the best config without them.  So a flip the model says cannot fit is paired and
relieved like one that ran out of memory, and where the model fits none of those, its floor
relief is launched: the number whose lowest value leaves the most room, at that value.  On
ties, which the model gives when no number changes its need at the smallest pool, a step's
token budget goes first (`SearchSpace.budgets`): its forward is activation memory on every server
the shipped spaces drive.  Only while the choice never ran healthy (after that the model has
seen what it needs), once per number.  An OOM of it teaches the model what the others' OOMs
could not.
Measured on 60 seeds (benchmarks/search_ab.py's worker): 70B mean / median best at 30 trials
.963 / .972 -> .983 / .999 (seeds won 37, lost 7), at 20 .955 -> .953 (4 won, 10 lost); the
other four scenarios identical seed by seed but for one 8B seed at 40 trials.  The cost is
OOMs: on the suite's 10 seeds, 70B's OOM launches after the first 5 trials went 30 -> 59 of
350 (8.6% -> 16.9%), mostly graph configs finding their edge, 2-3% above the smallest pool.
Measured and not kept: the floor relief run at the smallest pool (2 OOMs fewer in those 10
studies), and with it the edge of knobs that ran out of memory dropped `EDGE_TOL` below that
pool and bounded by like configs' OOMs (6 fewer); on 60 seeds neither moved a mean by more
than .001 (benchmarks/results/search_efficiency.md, round 12).  The budget tie-break came
after those: on 70B the ties had gone to the first number by name, the decode cap, whose floor
freed nothing and ran out of memory.  Local, 10 seeds of the suite's five scenarios and three
unseen ones: on 70B, OOM launches after the first 5 trials 54 -> 40 of 350 (15.4% -> 11.4%),
mean best at 20 / 30 / 40 trials .957 / .989 / .994 -> .983 / .986 / .994; every study of the
other seven scenarios identical.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from tuner.study.design import level
from tuner.study.flips import companions
from tuner.study.local_moves import STEP_SCALE, position, shift
from tuner.study.record import KV_SHARE, TrialRecord
from tuner.trial.kv_share import EDGE_TOL, KvEdge, others_key

RELIEF_STEPS = 10  # bisection steps of a relief: 1/1024 of the range


def pool_trade(top: TrialRecord, space: Mapping[str, BaseDistribution], edge: KvEdge | None,
               trials: Sequence[TrialRecord]) -> dict[str, Any] | None:
    """The incumbent `top` (as params over `space`) with the one number lowered that gives
    the largest pool (see module doc); None without a KV edge, without such a number, or
    once a trial has run `top` with one number lowered."""
    if edge is None or KV_SHARE not in space or edge.param.name not in top.params:
        return None
    numbers = _numbers(space, top.params)
    if trade_runs(top, space, edge.param.name, trials):
        return None
    base = {k: top.params[k] for k in space}
    rest = {k: v for k, v in base.items() if k != KV_SHARE}
    pool = int(top.params[edge.param.name])
    share = float(base[KV_SHARE])

    def grown(cand: dict[str, Any]) -> float:   # a pool past the peak demand buys nothing
        return edge.within_demand(cand, edge.value(cand, share, trials)) / pool - 1
    best, gain = None, EDGE_TOL
    for name in numbers:
        lower = shift(base[name], space[name], -STEP_SCALE)
        if lower != base[name] and (more := grown({**rest, name: lower})) > gain:
            best, gain = {**base, name: lower}, more
    if best is None:   # no step frees memory: the least move that does (see module doc)
        deeper = reliefs(rest, space, [lambda cand: grown(cand) > EDGE_TOL])
        best = {**deeper[0], KV_SHARE: share} if deeper else None
    return best


def trade_runs(top: TrialRecord, space: Mapping[str, BaseDistribution], kv_name: str,
               trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The launched trials that ran `top` with one number lowered (its pool aside)."""
    numbers = _numbers(space, top.params)
    return [t for t in trials
            if not t.unmeasured and _lowered(t.params, top.params, numbers, kv_name)]


def trades_of(top: TrialRecord, space: Mapping[str, BaseDistribution], edge: KvEdge | None,
              trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The runs of `top` with one number lowered that met the SLOs, the latest first: the
    trades to re-judge at their own edge (see module doc)."""
    if edge is None or KV_SHARE not in space:
        return []
    return [t for t in reversed(trade_runs(top, space, edge.param.name, trials))
            if t.feasible and t.original]


def failed_trades(top: TrialRecord, space: Mapping[str, BaseDistribution],
                  edge: KvEdge | None,
                  trials: Sequence[TrialRecord]) -> list[tuple[dict[str, Any], int]]:
    """The runs of `top` with one number lowered that ran out of memory, whose knobs (pool
    aside) ran no other time, the latest first: each as params over `space` with `top`'s KV
    share, and the pool halfway between `top`'s and the one that failed (see module doc)."""
    if edge is None or KV_SHARE not in space or edge.param.name not in top.params:
        return []
    name = edge.param.name
    pool = int(top.params[name])
    out = []
    for t in reversed(trade_runs(top, space, name, trials)):
        key = others_key(t.params, name)
        if t.outcome == "oom" and int(t.params[name]) > pool and sum(
                others_key(o.params, name) == key for o in trials if not o.unmeasured) == 1:
            rest = {k: t.params[k] for k in space if k not in (KV_SHARE, name)}
            out.append(({**rest, KV_SHARE: top.params[KV_SHARE]},
                        (pool + int(t.params[name])) // 2))
    return out


def _lowered(params: Mapping[str, Any], top: Mapping[str, Any], numbers: Sequence[str],
             kv_name: str) -> bool:
    """Whether `params` is `top` with exactly one of `numbers` lower (the pool aside)."""
    diff = [n for n in set(params) | set(top)
            if n not in (KV_SHARE, kv_name) and params.get(n) != top.get(n)]
    return len(diff) == 1 and diff[0] in numbers and params[diff[0]] < top[diff[0]]


def reliefs(cand: Mapping[str, Any], space: Mapping[str, BaseDistribution],
            fits: Sequence[Callable[[dict[str, Any]], bool]]) -> list[dict[str, Any]]:
    """`cand` with one number lowered to the largest value at which it fits by the first of
    `fits` that some value meets (see module doc): one per number that helps, the smallest
    move (as a share of its range) first."""
    out = []
    for name in _numbers(space, cand):
        dist = space[name]
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        for ok in fits:
            if ok(dict(cand)) or not ok({**cand, name: dist.low}):
                continue
            lo, hi = 0.0, position(cand[name], dist)   # invariant: fits at lo, not at hi
            for _ in range(RELIEF_STEPS):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if ok({**cand, name: level(dist, mid)}) else (lo, mid)
            value = level(dist, lo)
            if value < cand[name]:
                out.append((position(cand[name], dist) - lo, {**cand, name: value}))
            break
    return [c for _, c in sorted(out, key=lambda mc: mc[0])]


def _numbers(space: Mapping[str, BaseDistribution], params: Mapping[str, Any]) -> list[str]:
    return [n for n, d in space.items() if n != KV_SHARE and not d.single()
            and isinstance(d, (IntDistribution, FloatDistribution)) and n in params]


def floor_relief(cand: Mapping[str, Any], base: Mapping[str, Any],
                 space: Mapping[str, BaseDistribution], trials: Sequence[TrialRecord],
                 slack: Callable[[dict[str, Any]], float],
                 first: Collection[str] = ()) -> list[dict[str, Any]]:
    """`cand`, a flip of `base`, with the one number at its lowest value that leaves the most
    room by `slack`, on ties one of `first` (see module doc); [] once the flipped choice ran
    healthy, and for each number once a launched trial had the choice with that number at its
    lowest."""
    flipped = {k: v for k, v in cand.items() if k != KV_SHARE and base.get(k) != v}

    def has(t: TrialRecord) -> bool:
        return all(t.params.get(k) == v for k, v in flipped.items())
    launched = [t for t in trials if not t.unmeasured and has(t)]
    if any(t.outcome in ("ok", "slo") for t in launched):
        return []
    out = []
    for name in _numbers(space, cand):
        dist = space[name]
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        if cand[name] > dist.low and all(t.params.get(name) != dist.low for t in launched):
            low = {**cand, name: dist.low}
            out.append(((slack(low), name in first), low))
    return [c for _, c in sorted(out, key=lambda kc: kc[0], reverse=True)[:1]]


def pairs_of(cand: dict[str, Any], top: TrialRecord, base: dict[str, Any],
             trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
             slack: Callable[[dict[str, Any]], float], edge: KvEdge | None,
             budgets: Collection[str]) -> list[dict[str, Any]]:
    """What to try for a flip of the incumbent `top` (`base`: its params) that ran out of
    memory, never started or that the memory model says cannot fit: its companions that the
    model says fit (`tuner.study.flips.companions`), then its `reliefs`; where neither fits,
    its `floor_relief` (`budgets` first on ties)."""
    pairs = companions(cand, base, space, slack)
    fitting = [p for p in pairs if slack(p) >= 0]
    eased: list[dict[str, Any]] = []
    if edge is not None and KV_SHARE in cand:
        room = edge.room_at(trials)
        rest = {k: v for k, v in cand.items() if k != KV_SHARE}
        pool = edge.carried(int(top.params[edge.param.name]), top.params, rest)
        eased = reliefs(cand, space, [lambda c: room(c, pool) >= 0, lambda c: slack(c) >= 0])
    if not fitting and not eased:
        eased = floor_relief(cand, base, space, trials, slack, budgets)
    return [*fitting, *eased]

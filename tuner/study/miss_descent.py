"""While no run has met the SLOs: the run that missed least, with the one knob of what a step
holds that the runs so far tie most closely to its miss moved the way that lowers it (a descent
on the miss).

Why: until a run meets the SLOs there is no incumbent, and the local moves have nothing to
start from.  The waiting trade cures only a miss a larger pool can cure, and the ascent
(`tuner.study.ascent`) waits for five healthy runs and then moves every number that ranks with
the merit, which mixes the SLOs a run missed with those it met.  On the Mistral-7B / A100 80 GB
scenario of benchmarks/search_efficiency.py (16k prompts beside 128 chat requests, median TTFT
<= 5 s and p99 TPOT <= 80 ms; round 31) 5 of 10 seeds ended 10 trials with nothing feasible.
In two of them the start-up point with every cap open missed the TTFT SLO by 3% at the best
throughput of the study (1508 tok/s, the best known is 1501): one long prompt fewer per step
met it.  In three the same point had decode-first on and missed the median TTFT fivefold (25 s:
new requests wait for the running decodes); the next proposals copied that choice from it,
the run that missed least.

So the miss of the run that missed least (the log of value over limit of the SLO it missed
most) is ranked against each knob over the healthy runs: a number by its position in its range,
a choice by whether a run has it.  The knob with the strongest rank correlation moves; a number
halfway from its value to the end of its range that goes with a smaller miss, a choice to the
one that goes with it.  One knob at a time keeps the answer readable: the run of the move says
whether that knob cures the miss, and a move that missed less becomes the next run to descend
from.  A knob is moved once from a run (a run that changed it alone from there measured it),
and a number is not moved by less than `MIN_MOVE` of its range: halfway to an end it nearly
sits at is the same config again (on the Mistral scenario a 1051-token budget went to 1037,
and the run missed exactly as before).  A move that leaves what a step can hold in every cell
as it was (a decode cap raised above the batch cap beside it) is that run again, and the
proposals pass it by (`tuner.study.local_moves.fresh_in`).

Why each number's other way too, ranked after every move the correlations rank: the runs a
study has before anything met its SLOs were drawn far apart, and what ranks with the miss over
them is often something else they had.  On the Mistral-7B / RTX 4090 open-loop scenario of
benchmarks/search_efficiency.py (3k-token prompts arriving at 1 per second beside chat, p99
TTFT <= 8 s; round 40) seed 8 found nothing feasible in 40 trials.  Its least miss (1%) had
every cap at the top of its range and a 17k-token budget, and over its runs a larger budget
went with a smaller miss (the small-budget draws also had decode caps of 2-8): the only move
left was the long-context threshold, and no run lowered the budget, which met the SLO one step
down (another run of that seed: p99 TTFT 8065 ms, 7962 at a 4k budget).  So once every
correlated move was passed by, a number moves the other way (where its correlated way is spent:
a cap at the end of its range, a move too small to be one), and one the runs do not rank moves
either way.

A choice among them (decode-first, the long-context threshold) moves to each of its other values
the same way, last: on the Qwen2.5-7B / L40S TPOT scenario (y-qwen7b-l40s-tpot3, round 53)
seeds 5 and 6 ended 30 trials with nothing feasible; seed 6's least miss missed by 1.4% with
decode-first on, as every run near it had, and the best config has it off.  With this move
they reach 0.935 and 0.877 of the best; of 263 40-trial studies of 27 scenarios, 260 came out
identical (the other three, of that scenario, better or unchanged).

Only the knobs that decide what one step holds move: the request caps and the long-context
guard (`SearchSpace.limits`), the token budgets (`SearchSpace.budgets`) and the choice of which
requests go first (`POLICY_ROLES`).  A latency SLO is missed by what the steps hold: requests
that wait for a cap, decodes that wait behind a long prefill, prefills that wait behind
decodes.  Block size, CUDA graphs or prefix caching change how fast a step runs, and over a few
runs a choice seen once ranks with whatever else that run had: on the Mistral scenario, moved
too, every seed's last four turns went to block sizes and graph flips of the run that missed by
3%, and none lowered its long-context cap (10 trials: 5 of 10 seeds still found nothing).

Why CUDA graphs are turned on (role `cuda_graph`, the knob that makes a decode step faster):
a per-token latency (TPOT, ITL) is the time of the decode steps a request waits through, and a
request that waits for KV blocks (TTFT, end to end) waits for running requests to decode to
their end, so a faster decode step frees blocks sooner; the correlation over the start-up's
runs cannot say so, since graphs there came with whatever else those draws had.  On
Llama-3.1-8B / RTX 3090 under p99 TPOT <= 25 ms (benchmarks/search_scenarios.py,
w-8b-3090-tpot, seed 9) every run of a 30-trial study missed, the least by 2.3% with graphs
off, and the descent moved its caps and budget eight times.  Now graphs go on at trial 18, from
the least miss then (6.4%, graphs off): it met the SLO at 143 tok/s, and the incumbents climbed
to 233 (0.98 of the best known) by trial 26.  They rank by their correlation, but never below
`FAST_PRIOR`: after the moves the correlations rank, before any number's other way.  Ranked
first, they cost the Qwen2.5-7B / RTX 3090 decode scenario two 10-trial seeds (0.76 and 0.81 of
the best -> nothing feasible): there the least miss missed TPOT because a running-batch cap of
7 held requests back, graphs on missed as well, and the next runs followed it
(benchmarks/results/search_efficiency.md, round 48).  Until round 50 only a per-token miss
turned graphs on.  On the Mistral-7B / RTX 4090 open-loop scenario (3k-token prompts at 1 per
second beside chat, p99 TTFT <= 8 s) four 10-trial seeds ended with nothing feasible: the
least miss, every cap open at its edge without graphs, missed by 6-7%, its trade to a smaller
budget and a larger pool missed by as much, and the same knobs with graphs met the SLO at
0.98 of the best known (results round 50).

Why, for a waiting-time miss, the smallest block size (role `block_size`) too: a server
reserves a request's KV in whole blocks, so a pool of large blocks holds fewer requests than
the same tokens in small ones, and a request waiting for KV blocks waits on that rounding.  On
the Qwen2.5-7B / RTX 3090 open-loop scenario (2k-token prompts at 1.5 per second beside 48 chat
requests, p99 TTFT <= 10 s) two 10-trial seeds ended with nothing feasible: the least miss,
every cap open at its edge (41k tokens) with 128- or 256-token blocks, missed by 13.5%, and
the same knobs with 64-token blocks or smaller met the SLO at the best known (results round
51: a 2236-token request takes 2304 tokens in 128-token blocks, 2240 in 64-token ones, and 41k
tokens hold 17 such requests or 18).  It ranks by its correlation with the miss alone, after
every number's other way where the runs do not rank it: ranked like the faster step (never
below `FAST_PRIOR`), it cost the Mistral-7B / A100 80 GB median-TTFT scenario two seeds outside
the suite (3.8% at 10 trials, 2.1% at 20), whose least miss had one long prompt too many per
step and whose long-context cap came a turn later.  Where nothing else is left to move (the
last resort of `tuner.study.proposals`), it comes after the faster step.  Not for a per-token
miss: the requests a fuller pool admits make each decode step slower.

Why, for a per-token miss on a server whose steps prefill whole prompts or decode, never both
(`ServerSpec.prefill_steps: separate`, InfiniLM), each token budget at the top of its range:
there every prefill step stalls every running decode, and a budget that starts the waiting
prompts in fewer steps stalls them fewer times; a larger step costs about its tokens, the
stalls each add a step's fixed cost and break the decodes into more rounds.  The descent moves
a number halfway to its end, and the start-up corner draws the budget, so a study whose best
config opens the budget fully at its edge walks there in several turns or not at all.  On the
Qwen2.5-7B / L40S scenario of benchmarks/search_efficiency.py (y-qwen7b-l40s-tpot3: 2k, chat
and 8k prompts, p99 TPOT <= 24 ms; round 52) every 30-trial seed ended with nothing feasible:
the best config is a 32k budget at its memory edge, and the same config at half that budget
missed (28.9 ms).  It is ranked like the faster step (never below `FAST_PRIOR`), by the
correlation of a larger budget with a smaller miss.  Not where steps are mixed (vLLM, SGLang):
there a larger budget puts more prefill tokens beside the decodes of one step, which makes
that step longer.  Once a run has met the SLOs, a run that missed a per-token SLO most with
more throughput than the incumbent gets the same move (`tuner.study.per_token_repairs`): on the
Llama-3.2-3B / L40S scenario (z-3b-l40s-tpot: 1.2k prompts with 400-token answers beside 6k
prompts, p99 TPOT <= 26 ms) the start-up corner, every cap open at a 1.2k budget, missed by
34-45% at twice the incumbents' throughput, and the incumbents' neighbours never reached the
best config, that corner with a 32k budget at its edge.  Both stop once the study has measured
the move fail (`budget_tops`): a run with its budget at the top that missed no less than the
same knobs at a smaller budget.  On Llama-3.1-8B / RTX 3090 (w-8b-3090-tpot: 2k prompts with
768-token answers, p99 TPOT <= 25 ms), whose best config prefills 5.4k tokens a step at an
11.4k-token pool, a 32k budget's forward takes the pool's memory, and without that stop one
30-trial study spent five turns on such repairs, each missing as much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.bench.records import Cell
from tuner.search.space import SearchSpace
from tuner.study.ascent import pearson, ranks
from tuner.study.design import level
from tuner.study.edge_pushes import waiting
from tuner.study.local_moves import STEP_SCALE, position
from tuner.study.record import KV_SHARE, TrialRecord
from tuner.study.step_shape import held
from tuner.trial.kv_share import EDGE_TOL, KvEdge
from tuner.trial.memory_estimate import Estimate, estimate, knobs_from_params

MIN_RUNS = 3    # fewer healthy runs rank nothing
MIN_MOVE = STEP_SCALE / 2   # a number nearer than this share of its range to its end stays
POLICY_ROLES = ("decode_first",)   # choices of which requests a step takes first
SPEED_ROLES = ("cuda_graph",)   # choices that, on, make a decode step faster
PACK_ROLES = ("block_size",)    # choices that decide how much of a request's last block is waste
FAST_PRIOR = 1e-3   # the least rank of a faster decode step in the descent (module doc)
PER_TOKEN = ("tpot", "itl")   # SLO metrics of the time between one request's tokens
Tops = Callable[[Mapping[str, Any]], list[str]]   # a config's budgets whose top starts more


def policies(space: SearchSpace) -> list[str]:
    """The knobs of `space` that choose which requests one step takes first."""
    return [p.name for p in space.parameters if p.role in POLICY_ROLES]


def speeds(space: SearchSpace) -> list[str]:
    """The knobs of `space` that, on, make a decode step faster."""
    return [p.name for p in space.parameters if p.role in SPEED_ROLES]


def packings(space: SearchSpace) -> dict[str, Any]:
    """The knobs of `space` that round each request's KV up to whole blocks, each at its
    smallest block: the one that wastes least of a pool (module doc)."""
    return {p.name: min(p.choices) for p in space.parameters
            if p.role in PACK_ROLES and p.type == "categorical" and p.choices}


def whole_budgets(space: SearchSpace) -> list[str]:
    """The token budgets of `space` where its server's steps prefill whole prompts or decode,
    never both (`ServerSpec.prefill_steps`): their top stalls the decodes least (module doc)."""
    return space.budgets() if space.server.prefill_steps == "separate" else []


def budget_tops(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
                edge: KvEdge | None) -> Tops:
    """For a config: the `whole_budgets` of the edge's space that, at the top of their range,
    would start more prompts in one prefill step of some cell than the config does (a server
    that prefills whole prompts starts the first whatever its budget, and a prefill cap or the
    long-context guard can bind first); none once the study has measured the move fail: a run
    with them at their top where a run with the same other knobs (the pool aside) had them
    lower, that missed its per-token SLO no less (module doc)."""
    if edge is None:
        return lambda params: []
    names = [n for n in whole_budgets(edge.space) if n in space]
    others = [k for k in space if k != KV_SHARE]
    runs = [t for t in trials if t.outcome in ("ok", "slo") and t.original
            and all(k in t.params for k in others)]
    for moved in runs:
        for base in runs:
            diff = [k for k in others if moved.params[k] != base.params[k]]
            metric = worst(base)[0]
            if diff and set(diff) <= set(names) and per_token(metric) \
                    and all(moved.params[k] == top(space[k]) for k in diff) \
                    and _excess(moved, metric) >= _excess(base, metric):
                return lambda params: []

    def starts(params: Mapping[str, Any]) -> list[float]:
        k = knobs_from_params(edge.space, dict(params))
        return [min(held(c), k.prefill_limit,
                    (k.long_max_batch or math.inf) if k.calls_long(c) else math.inf,
                    max(1, k.token_budget // max(c.input_len, 1)) if k.token_budget
                    else math.inf) for c in edge.cells]

    def opening(params: Mapping[str, Any]) -> list[str]:
        now = starts(params)
        return [n for n in names if any(a > b for a, b in zip(
            starts({**params, n: top(space[n])}), now))]
    return opening


def per_token(constraint: str) -> bool:
    """Whether a constraint is an SLO on the time between one request's tokens."""
    return constraint.startswith("slo:") and any(m in constraint for m in PER_TOKEN)


def deferring(space: SearchSpace, cells: Sequence[Cell], params: dict[str, Any]) -> list[str]:
    """The policy knobs that hold some request of `cells` back in this config: decode-first,
    where the long-context guard calls a cell's prompts long (it defers only those)."""
    knobs = knobs_from_params(space, params)
    if not knobs.decode_first or not any(knobs.calls_long(c) for c in cells):
        return []
    return policies(space)


def descent_moves(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
                  steps: Collection[str], fast: Collection[str] = (),
                  packs: Mapping[str, Any] | None = None,
                  tops: Tops | None = None) -> list[dict[str, Any]]:
    """The moves of the run that missed its SLOs least, one of the `steps` knobs each (what a
    step holds), strongest correlation first, then each number's other way; each of the `fast`
    knobs turned on, and for a per-token miss each of the run's `tops` at the top of its range
    (`budget_tops`), ahead of every number's other way; for a waiting-time miss, each of the
    `packs` knobs set to its value (`packings`) by its correlation alone, after the other ways
    where it has none (see module doc); none with fewer than `MIN_RUNS` healthy runs."""
    found = _least_miss(trials, space)
    if found is None:
        return []
    runs, base = found
    metric = worst(base)[0]
    miss = ranks([_excess(t, metric) for t in runs])
    tried = _tried(base, runs, [k for k in space if k != KV_SHARE])
    # (tier, least rank, knob, value): a faster step and a whole-prompt budget at its top
    # ahead of every number's other way, a block by its correlation alone, after them where
    # it has none (module doc)
    priors = [(0, FAST_PRIOR, name, True) for name in fast]
    if waiting(metric):
        priors += [(1, 0.0, name, value) for name, value in (packs or {}).items()]
    opened = tops(base.params) if tops is not None and per_token(metric) else []
    priors += [(0, FAST_PRIOR, name, top(space[name])) for name in opened]
    scored: list[tuple[float, int, str, dict[str, Any]]] = []
    for tier, least, name, value in priors:   # a number moved alone has not measured its top
        if name in space and (name not in tried or name in opened) \
                and base.params[name] != value and _holds(space[name], value):
            rho = pearson(ranks([_at(t.params[name], value, space[name]) for t in runs]), miss)
            scored.append((-max(-rho, least), tier, name,
                           {**{k: base.params[k] for k in space}, name: value}))
    for name, dist in space.items():
        if name not in steps or name in tried or dist.single():
            continue
        for strength, value in _ways(name, dist, runs, miss, base.params[name]):
            scored.append((-strength, 0, name,
                           {**{k: base.params[k] for k in space}, name: value}))
    return [move for *_, move in sorted(scored, key=lambda s: s[:3])]


def held_pool(move: dict[str, Any], trials: Sequence[TrialRecord],
              space: Mapping[str, BaseDistribution], edge: KvEdge | None) -> int | None:
    """The pool of the run `move` descends from, where the move holds no more than that run in
    any cell (the memory estimate of each cell's forward, and of the static need, at that
    pool), so it fits where that run ran, and that run's KV share would draw it a pool larger
    by no more than `EDGE_TOL` (a gain that small is the same run, `fresh_in`).  None
    otherwise: the move keeps that run's share.

    Why: the run descended from is often at the edge (the start-up corner is drawn there), and
    a move that holds less in a step has, by the model, a larger edge of its own.  On the
    Mistral-7B / A100 80 GB scenario of benchmarks/search_efficiency.py (round 38, three of ten
    10-trial seeds) the move of the long-context cap 8 -> 5 from the corner rendered to 364.5k
    tokens where the corner had run at 362.7k, ran out of memory (the model's edge 0.5% over the
    simulator's), and no seed of the three measured that cap, the one that met the SLOs in the
    other seeds.  A larger gain is kept: on the Qwen2.5-7B / RTX 4090 RAG scenario (p99 TTFT)
    a smaller token budget from a corner at 0.75 of its edge drew 29.9k tokens where the corner
    ran 15.5k, and met the SLO that the corner's pool missed."""
    found = _least_miss(trials, space)
    if edge is None or found is None or edge.param.name not in found[1].params:
        return None
    base = found[1]
    name = edge.param.name
    pool = int(base.params[name])
    rest = {k: v for k, v in move.items() if k != KV_SHARE}
    target = edge.carried(pool, base.params, rest)

    def est(params: Mapping[str, Any], value: int) -> Estimate:
        knobs = knobs_from_params(edge.space, {**params, name: value})
        return estimate(edge.model, knobs, list(edge.cells))
    was, now = est(base.params, pool), est(rest, target)
    before = dict(was.cell_forwards)
    if now.static > was.static or any(f > before.get(c, 0) for c, f in now.cell_forwards):
        return None
    share = move.get(KV_SHARE)
    drawn = None if share is None else edge.value(rest, float(share), trials)
    return target if drawn is not None and target < drawn <= target * (1 + EDGE_TOL) else None


def _least_miss(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
                ) -> tuple[list[TrialRecord], TrialRecord] | None:
    """(the healthy runs that missed, the one that missed least); None with fewer than
    `MIN_RUNS` of them."""
    runs = [t for t in trials if t.outcome == "slo" and t.original and t.values is not None
            and all(k in t.params for k in space)]
    if len(runs) < MIN_RUNS:
        return None
    return runs, min(runs, key=lambda t: (worst(t)[1], t.number))


def _ways(name: str, dist: BaseDistribution, runs: Sequence[TrialRecord],
          miss: Sequence[float], value: Any) -> list[tuple[float, Any]]:
    """(strength, new value) for each way to move knob `name` from `value` that goes with a
    smaller miss over `runs`, and each other way at strength 0 (module doc)."""
    if isinstance(dist, CategoricalDistribution):
        out = []
        for choice in dist.choices:
            if choice == value:
                continue
            rho = pearson(ranks([float(t.params[name] == choice) for t in runs]), miss)
            out.append((max(-rho, 0.0), choice))   # the other way last
        return out
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    rho = pearson(ranks([position(t.params[name], dist) for t in runs]), miss)
    here = position(value, dist)
    out = []
    for down, strength in ((rho > 0, abs(rho)), (rho <= 0, 0.0)):   # the other way last
        moved = level(dist, here / 2 if down else (1 + here) / 2)
        if abs(position(moved, dist) - here) >= MIN_MOVE:
            out.append((strength, moved))
    return out


def top(dist: BaseDistribution) -> Any:
    """The top of a number's range; None for a choice (no such value)."""
    return dist.high if isinstance(dist, (IntDistribution, FloatDistribution)) else None


def _holds(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return value is not None and dist.low <= value <= dist.high


def _at(have: Any, value: Any, dist: BaseDistribution) -> float:
    """How near a run's `have` is to a prior's `value`: a choice's match, a number's position
    in its range (a number's prior is its top)."""
    if isinstance(dist, CategoricalDistribution):
        return float(have == value)
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return position(have, dist)


def _tried(base: TrialRecord, runs: Sequence[TrialRecord], names: Sequence[str]) -> set[str]:
    """The knobs a run changed alone from `base` (pool aside): their move has been measured."""
    out = set()
    for t in runs:
        diff = [k for k in names if t.params[k] != base.params[k]]
        if len(diff) == 1:
            out.add(diff[0])
    return out


def _excess(t: TrialRecord, metric: str) -> float:
    """How far `t` is from the limit of `metric`: log of value over limit (< 0 under it)."""
    return math.log(max(1e-9, 1.0 + t.constraints.get(metric, 0.0)))


def worst(t: TrialRecord) -> tuple[str, float]:
    """The SLO `t` missed most, and by how much (`_excess`)."""
    slos = [(k, _excess(t, k)) for k in t.constraints if k.startswith("slo:")]
    return max(slos, key=lambda s: s[1], default=("", 0.0))

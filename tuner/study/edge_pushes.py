"""Runs that missed a waiting-time SLO at a small pool, pushed once to their own memory edge.

Why: a request that waits for KV blocks waits before its first token, so a config run at a
small pool can miss a TTFT SLO that it meets at its edge.  The start-up design and TPE draws run
each config at a pool drawn as a share of its headroom, and the local moves push only the
incumbent, a run that met the SLOs.  On a Qwen2.5-7B / RTX 4090 RAG scenario of
benchmarks/search_efficiency.py (16 prompts of 3k tokens beside 48 chat requests, p99 TTFT
<= 15 s; round 25) the start-up point with every request cap open ran at 7.2k tokens of a ~40k
edge and missed the SLO (p99 TTFT 33 s); pushed to its edge in another seed it met it at 794
tok/s, the best known, while two seeds that never pushed it ended 30 trials at 0.77 and 0.84
of that.

Which: a run that missed only SLOs a larger pool can cure (time to the first token or end to
end: `MISSABLE`; a miss of a TPOT or ITL SLO never, since a larger pool holds a larger batch,
whose steps are slower), whose config ran once, whose edge is larger than its pool by more than
its miss (a miss of x% needs a pool at least x% larger even if the waiting fell as 1 / pool),
and whose throughput scaled to its edge beats the incumbent's: where throughput is KV-bound it
rises at most in proportion to the pool.  The largest such bound first; one push per config
(once pushed it ran twice, and the push's own outcome stands).  Only for a throughput to
maximise.

Measured and not kept: pushing runs that met the SLOs too, by the same bound, and a missed run
more than once.  On the fresh Mistral-7B / RTX 4090 scenario the worst seed at 30 trials fell
0.992 -> 0.886 and the OOM launches after the first 5 trials rose 24 -> 44 of 350, on the
Qwen2.5-7B RAG one 21 -> 39: each push is a launch at an edge the model has not measured for
that config.

Why the waiting trade, while no run has met the SLOs: there is no incumbent to push runs past,
and the run that missed a waiting-time SLO least may already sit at its edge, held small by its
own forward.  On that Qwen2.5-7B RAG scenario the start-up point with every cap open drew a
27k-token prefill budget: its edge was the smallest pool (8.2k tokens, two 3k prompts) and it
missed p99 TTFT by 97%; the ascent then raised the budget further, and 4 of 10 seeds ended 10
trials with nothing feasible.  A budget one step lower (11k) still left the model no room for a
larger pool; a 4k budget held 21k tokens and met the SLO.  So the trade picks the number
that must move least (`tuner.study.pool_trades.reliefs`: a bisection on the calibrated model)
for its edge to hold the pool the miss asks for, and runs it at that edge.  A run no single
lowered number can cure is passed over for the next least miss.  The start-up corner, where it
ran out of memory, is first run again at the edge its OOM corrected
(`tuner.study.design.corner_retry`): in one seed of that scenario it had, and the trade of a
run with mediocre caps gave an incumbent the local moves never left (0.898 of the best at 30
and 40 trials); retried, it missed the SLO and was traded.  Only where the study has such an
SLO (`waits`): the retry is there for the trade.  Under TPOT SLOs alone it ran out of memory
again in two of ten 10-trial studies of the Qwen2.5-7B / RTX 3090 decode scenario (2% under
the pool that had failed), and those two ended with nothing feasible where round 25's code
had found 0.38 and 0.76 of the best.

Why that number goes on down to its knee (the largest value whose edge is within `EDGE_TOL`
of its edge at the bottom of its range, or that holds the workload's peak demand), not just
as far as the miss asks: how far a miss falls with the pool is not known before the run, and
a trade that fell short is one more launch.  On the Mistral-7B / RTX 4090 open-loop scenario
(p99 TTFT <= 8 s, round 42) the start-up corner at its edge (a 26.9k-token budget, 20.0k
tokens) missed by 1%; the trade asked for 2% more pool, got it at a 12.3k budget, and missed
again, where a 2k budget held 23.3k tokens and met the SLO at 358 tok/s.  On the
Qwen2.5-7B / RTX 4090 RAG one a trade to a 6.6k budget (17.0k tokens) missed, to the knee
(3.6k, 38.4k tokens) it met the SLO at 793 tok/s.  A budget lowered past what the best config
needs costs throughput only until the local moves raise it again
(`tuner.study.open_caps.raised_budgets`).  Measured over the waiting-time scenarios of
benchmarks/search_efficiency.py: see its results, round 42.

Why a miss under `EDGE_TOL` is traded too, for a pool `EDGE_TOL` larger: until round 41 such
a run was taken for one whose pool already held the workload's peak demand, and never traded,
though a run that missed by 1% is the nearest to the SLOs a study has.  On the Mistral-7B /
RTX 4090 open-loop scenario (3k-token prompts at 1 per second beside chat, p99 TTFT <= 8 s)
the start-up corner at its edge missed by 1% with a 27k-token budget, and the seeds spent their
next turns on pushes of misses tenfold worse; traded, 4 of its 40 studies found a feasible
config they had not, none lost one, and 13 other scenarios with a waiting-time SLO came out
identical (benchmarks/results/search_efficiency.md, round 41).

Why a trade that ran out of memory is traded once more: its OOM says nothing of the SLOs, and
it corrected the model's edge for its knobs (`KvEdge.edge`), so the trade asked again lands
at a pool the card holds, or lowers the number further.  On the Qwen2.5-7B / RTX 3090
open-loop scenario seed 0's 10-trial study traded the start-up corner's budget from 26.9k
tokens to 2.4k; that ran out of memory 1% over the card, and the study ended with nothing
feasible.  Traded again, the same knobs at the corrected edge met the SLO at 491 tok/s, 0.999
of the best known (round 41).  Not after a trade that ran healthy, and not after two OOMs.

Why, while no run has met the SLOs, the run that missed a waiting-time SLO least is first
pushed to its own edge (`unmet_moves`), before any trade: its own run measured its forward, so
its edge is the model's best guess, where a trade's new knobs get the scale of the nearest
measured config, of whatever kind of forward.  And why with no bound from its miss: near the
memory edge the wait for blocks falls far faster than 1 / pool.  On the Qwen2.5-7B / RTX 3090
open-loop scenario (2k-token prompts arriving at 1.5 per second beside chat, p99 TTFT <= 10 s,
round 39) one config's p99 TTFT was 43.6 s at a 10k-token pool, 11.4 s at 40k and 8.6 s at 41k
(42k ran out of memory): only pools within ~3% of the edge met the SLO, and every start-up
point, drawn at a share of its edge, missed it.  There 15 of 19 waiting trades ran
out of memory (the scale carried to them put the edge up to 17% high), and the study met the
SLO first at 0.000 / 0.481 / 0.963 / 0.970 of the best (median of 10 seeds at 10 / 20 / 30 / 40
trials); pushing the least miss first: see benchmarks/results/search_efficiency.md, round 39.

Why, while no run has met the SLOs, a push goes first only where it could miss less than every
run that missed at its own edge, if the wait fell as 1 / pool, and the trade of the least miss
comes before the other pushes: until round 45 every run that missed and ran once was pushed
before any trade, whatever its miss. On the Qwen2.5-7B / RTX 3090 open-loop scenario seed 6's
10-trial study pushed the start-up corner to its edge (27.5k tokens under a 4.3k-token budget;
p99 TTFT 15.1 s against 10 s), then pushed a config with a prefill cap of 1 (out of memory),
the server's default (batch cap 8) and a config with a decode cap of 3, and traded the corner
only with its last launch (a 3.6k budget, 40.3k tokens, 11.4 s): nothing feasible. Now the
trade comes at the seventh launch, and the corner at that trade's own edge (41.5k) met the SLO
at 492 tok/s, the best known. Why runs at their edge only: a run below its edge is itself a
push to make, not a bar for others. On the Qwen2.5-7B / RTX 4090 RAG scenario (seed 9, 10
trials) the least miss (23%, at 78% of its edge) had been pushed and ran out of memory;
measured against it, the corner's push (a 74% miss at 92% of its edge) was passed over for the
server's default and a trade that ended at 486 tok/s, where the corner pushed (19%) and traded
found 793. Round 39's case stays: a 3.3x miss at a tenth of its edge is pushed first, since its
pool could cure it. And a trade asks for the pool the miss needs or, where no one number frees
that much, the most one number frees (`_reach`): a 2.1x miss at 14.6k tokens asks for 45k,
where the budget at the bottom of its range frees 41k, and until round 45 no trade was made.
Measured on the open-loop scenarios of benchmarks/search_efficiency.py: see its results, round
45.

Why a push that could not miss less than the least miss at its edge, at 1 / pool (the last
resort of `unmet_moves`), waits for the least miss with a faster decode step (its CUDA graphs
on, `tuner.study.miss_descent`): until round 50 no such move came before it, and on the
Mistral-7B / RTX 4090 open-loop scenario (p99 TTFT <= 8 s) four 10-trial seeds ended with
nothing feasible after pushing runs that missed by 1.1x to 16x (twice out of memory), while
the least miss, 6% over at its edge with its trade as far over, was never moved; with graphs
on, its knobs met the SLO.  Only that move: the rest of the descent placed before these pushes
too lost a 20-trial seed of the Qwen2.5-7B / RTX 3090 open-loop scenario (0.994 of the best ->
nothing feasible), where the pushes' healthy runs had moved the model's edge of the least
miss's knobs up to a pool that met the SLO.  And only where such a push is left: otherwise the
descent ranks graphs after the moves the runs' correlations rank.  Put first, the graph flip
cost three 10-trial seeds of the Mistral-7B / A100 80 GB scenario (median TTFT and p99 TPOT)
0.5-3.3% of their best: their least miss missed the median TTFT by 3% with one long prompt too
many per step, graphs on missed by as much, and the long-context cap came a turn later
(results round 50).

Why no push past a larger pool of the same knobs that missed the SLOs the run met
(`outgrown`): a larger pool admits more requests at once, so a TTFT or TPOT that grew past its
limit at a larger pool grows further above it, and a push beyond that pool is a launch the
study can only lose.  On the Llama-3.1-8B / A100 40 GB RAG scenario of
benchmarks/search_efficiency.py (p99 TTFT <= 12 s, round 27) seed 1's 10-trial study met the
SLO at 35.2k tokens (0.83 of the best), missed it at 41.5k, and spent its last three launches
on the memory edge above (44.7k missed it too, 46.2k and 45.5k ran out of memory).  Measured
and not kept: stopping too where a larger pool met the SLOs but ran no faster.  Throughput
steps with the pool rather than rising smoothly: on the Mistral-7B / A100 mixed scenario one
config ran 946 tok/s at 52.6k and at 74.4k tokens, and 1008 at its edge, 75.8k; that seed
ended 20 trials at 0.94 of the best instead of 1.00.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection

from tuner.study.pool_trades import reliefs, trade_runs
from tuner.study.record import KV_SHARE, TrialRecord, knobs_key
from tuner.trial.kv_share import EDGE_TOL, KvEdge

MISSABLE = ("ttft", "e2el")   # SLO metrics a request waiting for KV blocks adds to


def _miss(t: TrialRecord) -> float | None:
    """By how much `t` missed its SLOs (the largest relative excess) where it missed only
    ones a larger pool can cure (`MISSABLE`); None otherwise."""
    missed = {name: v for name, v in t.constraints.items() if v > 0}
    if t.outcome != "slo" or not missed or not all(map(waiting, missed)):
        return None
    return max(missed.values())


def promising(top: TrialRecord, trials: Sequence[TrialRecord], edge: KvEdge | None,
              search_space: Mapping[str, BaseDistribution],
              directions: Sequence[StudyDirection]) -> list[TrialRecord]:
    """The runs to push to their edge after the incumbent `top` (see module doc), the largest
    bound first; none without a KV edge or with a first objective to minimise."""
    if edge is None or KV_SHARE not in search_space or not top.values \
            or directions[0] != StudyDirection.MAXIMIZE:
        return []
    name = edge.param.name
    knobs = [k for k in search_space if k != KV_SHARE]
    complete = [t for t in trials if name in t.params and all(k in t.params for k in knobs)]
    runs = Counter(knobs_key(t.params, name) for t in complete)
    ranked = []
    for t in complete:
        miss = _miss(t)
        if miss is None or not t.original or not t.values or runs[knobs_key(t.params, name)] != 1:
            continue
        rest = {k: t.params[k] for k in knobs}
        pool = int(t.params[name])
        target = edge.within_demand(rest, edge.edge(rest, trials))
        if pool > 0 and target > pool * (1 + max(EDGE_TOL, miss)):
            bound = t.values[0] * target / pool
            if bound > top.values[0]:
                ranked.append((-bound, t.number, t))
    return [t for _, _, t in sorted(ranked, key=lambda r: r[:2])]


def unmet_moves(trials: Sequence[TrialRecord], edge: KvEdge | None,
                search_space: Mapping[str, BaseDistribution],
                ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """While no run has met the SLOs, (the move, the last resort), at most one of them set.
    The move: of the runs that missed only a waiting-time SLO (`_miss`) and ran once, the
    least miss among those whose push to their own edge (`at_edge`) would miss less than any
    run that missed at its edge if the wait fell as 1 / pool (`_after`), pushed; else the least
    miss that can be traded (`_trade`).  Only where there is no move, the last resort: the
    least miss pushed whatever it would miss (module doc).  At its edge: run
    at a share of its headroom within `EDGE_TOL` of 1, or with no push left (`at_edge`).  See
    module doc."""
    if edge is None or KV_SHARE not in search_space:
        return None, None
    name = edge.param.name
    runs = Counter(knobs_key(t.params, name) for t in trials if name in t.params)
    misses = [(miss, run, at_edge(run, trials, search_space, edge))
              for miss, run in _waiting_misses(trials, name)]
    pushes = [(miss, run, pushed) for miss, run, pushed in misses
              if pushed is not None and runs[knobs_key(run.params, name)] == 1]
    least = min((miss for miss, run, pushed in misses
                 if pushed is None or float(run.params.get(KV_SHARE, 0.0)) >= 1 - EDGE_TOL),
                default=math.inf)
    for miss, run, pushed in pushes:
        if _after(miss, run, pushed, edge, trials) < least:
            return pushed, None
    for miss, run, _ in misses:
        if (traded := _trade(miss, run, trials, edge, search_space)) is not None:
            return traded, None
    return None, pushes[0][2] if pushes else None


def _after(miss: float, run: TrialRecord, move: dict[str, Any], edge: KvEdge,
           trials: Sequence[TrialRecord]) -> float:
    """The miss of `run` moved to `move` (run at its edge) if the wait fell as 1 / pool."""
    rest = {k: v for k, v in move.items() if k != KV_SHARE}
    pool = edge.within_demand(rest, edge.edge(rest, trials))
    return (1 + miss) * int(run.params[edge.param.name]) / max(pool, 1) - 1


def _trade(miss: float, run: TrialRecord, trials: Sequence[TrialRecord], edge: KvEdge,
           search_space: Mapping[str, BaseDistribution]) -> dict[str, Any] | None:
    """`run` with the one number that its edge needs lowered least to hold a pool larger than
    the run's by more than its miss (or the workload's peak demand, where that is less; or the
    largest pool one number can reach, where that is less), lowered on to its knee (`_knee`),
    at that edge; once per run, twice where the first ran out of memory.  None where no
    number can raise the pool by more than `EDGE_TOL`."""
    name = edge.param.name
    done = trade_runs(run, search_space, name, trials)
    if len(done) > 1 or any(t.outcome != "oom" for t in done):
        return None
    rest = {k: run.params[k] for k in search_space if k != KV_SHARE}
    pool = int(run.params[name])
    wanted = math.ceil(pool * (1 + max(EDGE_TOL, miss)))
    target = edge.within_demand(rest, min(wanted, _reach(rest, search_space, edge, trials)))
    if target < wanted and target <= pool * (1 + EDGE_TOL):
        return None    # the pool already holds the peak demand, or no number frees more
    found = reliefs(rest, search_space, [_holding(edge, trials, target)])
    if not found:
        return None
    return {**_knee(found[0], rest, search_space, edge, trials, target), KV_SHARE: 1.0}


def _reach(rest: dict[str, Any], search_space: Mapping[str, BaseDistribution], edge: KvEdge,
           trials: Sequence[TrialRecord]) -> int:
    """The largest pool one number of `rest` at the bottom of its range gives an edge of,
    `EDGE_TOL` under it."""
    lows = [edge.edge({**rest, n: d.low}, trials) for n, d in search_space.items()
            if n != KV_SHARE and n in rest and isinstance(d, (IntDistribution, FloatDistribution))
            and d.low < rest[n]]
    return int(max(lows, default=0) * (1 - EDGE_TOL))


def _knee(trade: dict[str, Any], rest: dict[str, Any],
          search_space: Mapping[str, BaseDistribution], edge: KvEdge,
          trials: Sequence[TrialRecord], target: int) -> dict[str, Any]:
    """`trade` (`rest` with one number lowered for an edge of `target`) with that number
    lowered on to its knee: the largest value whose edge is within `EDGE_TOL` of the edge at
    the number's lowest value, or holds the workload's peak demand (see module doc)."""
    name = next(k for k in trade if trade[k] != rest[k])
    dist = search_space[name]
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    most = edge.edge({**rest, name: dist.low}, trials)
    goal = edge.within_demand(rest, int(most * (1 - EDGE_TOL)))
    if goal <= target:
        return trade
    deeper = reliefs(rest, {name: dist}, [_holding(edge, trials, goal)])
    return deeper[0] if deeper else trade


def _waiting_misses(trials: Sequence[TrialRecord],
                    kv_name: str) -> list[tuple[float, TrialRecord]]:
    """(miss, run) of the runs of their own that missed only a waiting-time SLO (`_miss`),
    the least miss first (the earlier run on a tie)."""
    missed = sorted((miss, t.number, t) for t in trials if t.original and t.values
                    and kv_name in t.params and (miss := _miss(t)) is not None)
    return [(miss, t) for miss, _, t in missed]


def _holding(edge: KvEdge, trials: Sequence[TrialRecord],
             target: int) -> Callable[[dict[str, Any]], bool]:
    """Whether a config's edge holds a pool of `target`."""
    return lambda params: edge.edge(params, trials) >= target


def outgrown(run: TrialRecord, trials: Sequence[TrialRecord], kv_name: str) -> bool:
    """Whether `run` met the SLOs and its knobs ran at a larger pool that missed them: then
    no push of it (see module doc)."""
    pool = run.params.get(kv_name)
    if pool is None or not run.feasible:
        return False
    key = knobs_key(run.params, kv_name)
    return any(t.original and t.outcome == "slo" and t.params.get(kv_name, 0) > pool
               and knobs_key(t.params, kv_name) == key for t in trials)


def waits(trials: Sequence[TrialRecord]) -> bool:
    """Whether the study has an SLO a request waiting for KV blocks adds to (`MISSABLE`)."""
    return any(waiting(name) for t in trials for name in t.constraints)


def at_edge(top: TrialRecord, trials: Sequence[TrialRecord],
            search_space: Mapping[str, BaseDistribution],
            edge: KvEdge | None) -> dict[str, Any] | None:
    """`top` with its pool at its own edge, or at the pool that holds the workload's peak
    demand where that is lower (`KvEdge.useful`), where that is more than `EDGE_TOL` above the
    pool it ran; None otherwise.  Its own run measured its forward
    (`tuner.trial.kv_calibration`), so its edge is the model's best guess, and the best configs
    of a KV-bound workload sit just under it; an OOM there bisects the real edge
    (`KvEdge.edge`).  None too where a larger pool of the same knobs missed the SLOs it met
    (`outgrown`)."""
    if edge is None or KV_SHARE not in search_space or outgrown(top, trials, edge.param.name):
        return None
    rest = {k: top.params[k] for k in search_space if k != KV_SHARE}
    pool = top.params.get(edge.param.name)
    target = edge.within_demand(rest, edge.edge(rest, trials))
    if pool is None or target <= int(pool) * (1 + EDGE_TOL):
        return None
    return {**rest, KV_SHARE: edge.share_of(rest, target, trials)}


def waiting(constraint: str) -> bool:
    """Whether a constraint is an SLO a request waiting for KV blocks adds to (`MISSABLE`)."""
    return constraint.startswith("slo:") and any(m in constraint for m in MISSABLE)

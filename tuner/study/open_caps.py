"""Open caps: the incumbent with one batch cap that holds fewer requests than the workload
keeps in flight raised to that count, or one token budget that holds fewer prompt tokens
raised towards them as far as its own pool allows.

Why: a cap on the requests of one step (running requests, a prefill or a decode batch) below
the concurrency of the busiest cell of the matrix makes requests wait for one another, and no
other knob makes up for it.  On the fresh Mistral-7B / RTX 4090 scenario of
benchmarks/search_efficiency.py one seed ended 30 trials at 0.90 of the best with a decode
cap of 19 beside a 48-request chat cell: every decode cap from 38 up ran 11% faster, and the
cap was never moved, because its local turns went to the incumbent's categorical flips and to
random one-or-two-knob neighbours (one number of eight, at most a quarter of its range).  The
move is the smallest change that stops the cap from binding: above the cell's concurrency a
cap holds nothing back.  A cap kept low on purpose (a tight TPOT SLO) is kept by the run: the
raised config misses the SLO and is never tried again.

Why an open cap is tried once: it asks whether the cap binds, and its run answers that at
whatever pool it ran.  Once a raised config (pool aside) has run healthy, the raise is not
proposed again at another pool: as the model's edge for it moved, each new pool was a config not
run yet, and on a Llama-3.1-8B / RTX 3090 scenario one study ran a prefill cap raised 5 -> 24 at
five pools, three of them out of memory, the healthy two at 206 tok/s beside the incumbent's 241
(benchmarks/results/search_efficiency.md, round 25).  Its pool is pushed further only if it
becomes the incumbent.

Why budgets too, and only as far as the pool allows: a step's token budget below the prompt
tokens the busiest cell has in flight makes prompts wait for one another the same way.  On a
Mistral-7B / H100 chat scenario (128 requests of 200 tokens, 32 of 1000) one seed ended 30
trials at 0.898 of the best with its budget at the bottom of the range, 1234 tokens: the
throughput rises with the budget at every step to 25.6k (6234 -> 6941 tok/s), and no move
raised it (pool trades only lower numbers, and one random neighbour of eight numbers lowered
it).  But a budget's forward takes memory from the KV pool (`tuner.study.pool_trades` makes
that trade the other way), and raised to the prompts at any cost it launched the incumbent's
pool where the model put the new edge: on the fresh Mistral-7B / RTX 4090 scenario the OOM
launches after the first 5 trials went from 20 to 38 of 350.  So a budget is raised only as far
as the incumbent's own pool still fits by the calibrated model, and the raised config runs at
that pool: it buys the budget with free memory, never with pool.

Why the long-context guard's cap too: it caps the long requests of one step (role
`long_max_batch`), and below the long requests a cell keeps in flight it makes them wait for one
another just as a batch cap does.  The long requests are the ones the config's own threshold
calls long (prompt, or prompt + output where `long_use_total_len`).  On the Llama-3.2-1B / A100
40 GB scenario of benchmarks/search_efficiency.py (96 chat requests beside 12 prompts of 12k
tokens, round 30) one seed ended 30 and 40 trials at 0.85 of the best with 3 long prompts per
step, its batch caps open: every config at 0.99 or more of the best ran 8.  A guard kept low on
purpose (memory, or the decodes it protects) is kept by the run, as for the batch caps.

Why the edge between an open cap and the incumbent's is bisected: opened to the requests in
flight, a cap may cross an SLO (or the memory) that a value between holds.  On the Mistral-7B
/ A100 80 GB scenario (16k prompts beside chat under a median TTFT SLO, round 31) throughput
rose with the long prompts prefilled per step, 2 -> 7 from 0.80 to 1.00 of the best, and 8,
their count in flight, missed the SLO; seeds sat at 4 or 5 with 8 tried and refused, and no
move tried 6 or 7.  So where a cap raised above the incumbent's value, the other knobs (pool
aside) the incumbent's, missed an SLO or ran out of memory, the value midway between is tried:
each run narrows the bracket, as the KV pool's bisection against the memory edge does.

Why a cap never raised is opened before a bracket is bisected: the first raise of a cap asks
whether it binds at all, a bisection step only where between two values already run it stops
binding, so with a fixed budget the first questions come first.  On the Mistral-7B / RTX 4090
chat scenario (48 requests in flight, round 34) one seed ended 30 trials at 0.90 of the best: its
incumbent's prefill cap, raised 9 -> 48, ran out of memory at the edge pool, and the three
numeric turns after it bisected that bracket (21 out of memory, 14, 17) while its decode cap of
19, below the 48 requests it decodes, was never raised.  A bracket waits at most one turn per cap.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.space import SearchSpace
from tuner.study.design import level
from tuner.study.local_moves import fresh_in, position
from tuner.study.record import KV_SHARE, TrialRecord, knobs_key
from tuner.study.step_shape import held
from tuner.trial.kv_share import EDGE_TOL, KvEdge
from tuner.trial.memory_estimate import knobs_from_params
from tuner.trial.prescreen import HEALTHY

CAP_ROLES = ("max_batch", "prefill_batch_cap", "decode_batch_cap")   # counts of requests
LONG_CAP_ROLE = "long_max_batch"   # counts of long requests
RAISE_STEPS = 10   # bisection steps of a raised budget: 1/1024 of the range


def in_flight(cells: Sequence[Cell]) -> int:
    """The most requests one cell of the matrix keeps in flight (0 without cells)."""
    return max((held(c) for c in cells), default=0)


def prompt_tokens(cells: Sequence[Cell]) -> int:
    """The most prompt tokens one cell of the matrix has in flight (0 without cells)."""
    return max((held(c) * c.input_len for c in cells), default=0)


def request_caps(space: SearchSpace) -> list[str]:
    """The knobs of `space` that cap the requests of one step."""
    return [p.name for p in space.parameters if p.role in CAP_ROLES]


def cap_targets(space: SearchSpace, params: Mapping[str, Any],
                cells: Sequence[Cell]) -> dict[str, int]:
    """Per cap of `space` on the requests of one step: the requests a cell of the matrix keeps
    in flight that it caps, for the config `params` (the batch caps: every request; the
    long-context guard's: the requests its own threshold calls long, where any is)."""
    out = {name: in_flight(cells) for name in request_caps(space)}
    knobs = knobs_from_params(space, dict(params))
    long = [c for c in cells if knobs.calls_long(c)]
    out.update({p.name: in_flight(long) for p in space.parameters
                if p.role == LONG_CAP_ROLE and long})
    return out


def _reaching(dist: IntDistribution, want: int) -> int:
    """The least value of `dist`'s grid at or above `want`, the top of its range where none."""
    return min(dist.high, dist.low + -(-(min(want, dist.high) - dist.low) // dist.step)
               * dist.step)


def opened_caps(params: Mapping[str, Any], caps: Mapping[str, int],
                dists: Mapping[str, BaseDistribution]) -> list[dict[str, Any]]:
    """`params` (restricted to `dists`) with one of the request `caps` below the requests it
    should hold (`cap_targets`) raised to that count (to the top of its range where that is
    lower), the most binding cap first."""
    base = {k: params[k] for k in dists}
    out = []
    for name, want in caps.items():
        dist = dists.get(name)
        if not isinstance(dist, IntDistribution) or dist.single():
            continue
        target = _reaching(dist, want)
        if target > int(base[name]):
            out.append((int(base[name]) / target, {**base, name: target}))
    return [c for _, c in sorted(out, key=lambda rc: rc[0])]


FAILED_RAISES = ("slo", "oom")


def bisected_caps(params: Mapping[str, Any], caps: Collection[str],
                  dists: Mapping[str, BaseDistribution], trials: Sequence[TrialRecord],
                  kv_name: str) -> list[dict[str, Any]]:
    """`params` (restricted to `dists`) with one of the request `caps` midway between its value
    and the least value above it that failed with `params`'s other knobs, the pool aside (see
    module doc); none for a cap with no value left between."""
    base = {k: params[k] for k in dists}
    out = []
    for name in caps:
        dist = dists.get(name)
        if not isinstance(dist, IntDistribution) or dist.single():
            continue
        def others(p: Mapping[str, Any], name: str = name) -> str:
            return knobs_key({k: p.get(k) for k in base if k != name}, kv_name)
        value, key = int(base[name]), others(base)
        failed = [int(t.params[name]) for t in trials
                  if t.outcome in FAILED_RAISES and name in t.params
                  and int(t.params[name]) > value and others(t.params) == key]
        if failed:
            mid = level(dist, (position(value, dist) + position(min(failed), dist)) / 2)
            if value < mid < min(failed):
                out.append({**base, name: mid})
    return out


def cap_moves(params: Mapping[str, Any], caps: Mapping[str, int],
              dists: Mapping[str, BaseDistribution], trials: Sequence[TrialRecord],
              kv_name: str) -> list[dict[str, Any]]:
    """The cap moves of `params` in the order they are tried (see module doc): the caps never
    raised with its other knobs opened (`opened_caps`), then the brackets of those whose raise
    failed bisected (`bisected_caps`), then any other open cap whose config never ran
    healthy."""
    def moved(cand: Mapping[str, Any]) -> str:   # each move changes one cap
        return next(k for k in cand if cand[k] != params[k])
    halved = bisected_caps(params, caps, dists, trials, kv_name)
    bracketed = {moved(c) for c in halved}
    opened = untested(opened_caps(params, caps, dists), trials, kv_name)
    return [*(c for c in opened if moved(c) not in bracketed), *halved,
            *(c for c in opened if moved(c) in bracketed)]


def untested(cands: Sequence[dict[str, Any]], trials: Sequence[TrialRecord],
             kv_name: str) -> list[dict[str, Any]]:
    """The `cands` whose config, the pool aside, never ran healthy (see module doc)."""
    ran = {knobs_key(t.params, kv_name) for t in trials
           if t.outcome in HEALTHY and not t.unmeasured}
    return [c for c in cands if knobs_key(c, kv_name) not in ran]


def raised_budgets(params: Mapping[str, Any], budgets: Collection[str],
                   dists: Mapping[str, BaseDistribution], cells: Sequence[Cell],
                   fits: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """`params` with one token budget below `prompt_tokens(cells)` raised towards it, as far
    as `fits` (the incumbent's own pool still fits) allows, the most binding first; none where
    no value more than `EDGE_TOL` higher fits (the same study raised a budget 8180 -> 8186
    twice, each time after the model's edge had moved a little)."""
    want = prompt_tokens(cells)
    out = []
    for name in budgets:
        dist = dists.get(name)
        if not isinstance(dist, IntDistribution) or dist.single():
            continue
        value, top = int(params[name]), _reaching(dist, want)
        if top <= value:
            continue
        if not fits({**params, name: top}):
            lo, hi = position(value, dist), position(top, dist)   # fits at lo
            for _ in range(RAISE_STEPS):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if fits({**params, name: level(dist, mid)}) else (lo, mid)
            top = level(dist, lo)
        if top > value * (1 + EDGE_TOL):   # a raise of a few tokens measures the same run
            out.append((value / top, {**params, name: top}))
    return [c for _, c in sorted(out, key=lambda rc: rc[0])]


def raised_budget(top: TrialRecord, trials: Sequence[TrialRecord],
                  space: Mapping[str, BaseDistribution], slack: Callable[[dict[str, Any]], float],
                  edge: KvEdge | None,
                  budgets: Collection[str]) -> tuple[dict[str, Any], int] | None:
    """`top` with a token budget below the busiest cell's prompts raised as far as its own
    pool still fits (`raised_budgets`), pinned to that pool, where it fits by `slack` and was
    not run yet; None without one."""
    if edge is None or KV_SHARE not in space or edge.param.name not in top.params:
        return None
    room = edge.room_at(trials)
    pool = int(top.params[edge.param.name])
    base = {k: top.params[k] for k in space}

    def at_pool(cand: dict[str, Any]) -> tuple[dict[str, Any], int]:
        rest = {k: v for k, v in cand.items() if k != KV_SHARE}
        return rest, edge.carried(pool, top.params, rest)
    fresh = fresh_in(trials, edge)
    for cand in raised_budgets(base, budgets, space, edge.cells,
                               lambda c: room(*at_pool(c)) >= 0):
        if fresh(cand, slack, pinned := at_pool(cand)[1]):
            return cand, pinned
    return None

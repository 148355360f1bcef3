"""Repairs of a run that missed a per-token SLO (TPOT, ITL) most with more throughput than the
incumbent, once a run has met the SLOs: the moves the descent on the least miss
(`tuner.study.miss_descent`) would make first, were nothing feasible yet, and one it cannot.
The better run first; each a single change, so that its run says what it cured.

* `topped`: its whole-prompt token budgets at the top of their range, on a server whose steps
  prefill whole prompts or decode (`miss_descent.budget_tops`; why: `tuner.study.miss_descent`).
* `faster`: a faster decode step (CUDA graphs on: `miss_descent.speeds`), at that run's pool
  where it fits.  On the Llama-3.2-3B / L40S scenario of benchmarks/search_efficiency.py
  (z-3b-l40s-tpot: 1.2k prompts with 400-token answers beside 6k prompts, p99 TPOT <= 26 ms;
  round 54) seed 6 ran every cap open with a 32k budget and graphs off at 85.3k and 92.3k
  tokens (trials 10 and 12: 1202 and 1203 tok/s, 11% and 17% over), and the incumbents stayed
  at 611 tok/s for 30 trials.  Now graphs on at 92.2k run 1338 tok/s at 6.7% over (trial 22);
  one request fewer (below), 86.8k, 0.4% over; one more, 80.6k, 1337 tok/s within the SLO
  (trial 26), the best known.
* `fewer_repairs`: the same knobs at the largest pool that holds one request fewer of a cell
  whose requests in flight the pool, not a cap, bounds.

A run whose knobs (its pool aside) a better run had does not get the faster step again: on
seed 9 of the scenario below, a start-up config ran at 95.0k and 90.2k tokens (1203 tok/s
each, 17% over); graphs on at the first pool missed by 6.7%, and graphs on at the second spent
a turn to measure that again.  Its cuts are each run's own: one request fewer than each pool.

The last two only for a run whose objective, scaled down by its miss (1 + the share it missed
by), still beats the incumbent's: a cure that slows each token to the SLO keeps no more
throughput than that.  They come before the incumbent's own flips, and without that bound a
10-trial study of Llama-3.2-1B / RTX 3090 with 8k-24k prompts (1b-3090-long, seed 9) spent its
fifth trial turning graphs on in a start-up run that had missed p99 TPOT by 85% at the
incumbent's 126 tok/s, where the incumbent's decode-first flip ran 301, and ended at 0.82 of
the best instead of 0.999.

Why one request fewer: a server that reserves a request's KV for its prompt and answer admits
as many requests of a cell as whole requests fit in the pool, and every request admitted
decodes in the same steps, so a per-token latency moves with the pool in steps of one request,
while a waiting time or the throughput of a cell whose caps bind does not.  On the same
scenario seed 5 ran the best known config's knobs at an 85.6k-token pool at trial 10: 1337
tok/s, p99 TPOT 26.1 ms (0.4% over), thirteen 6.2k-token requests in flight.  The next turns
pushed it to its edge (92.9k tokens, 6.7% over) and the study ended 30 trials at 611 tok/s.
At 80.0k tokens, twelve requests, the same knobs measure 1337 tok/s at 24.5 ms: the
thirteenth request's blocks bought no throughput.  One request fewer is the least pool move
that changes what a step holds; a larger cut (the least miss at half its requests, round 52)
cost a scenario whose least miss was held back by a running-batch cap.  Where a cap binds, the
pool holds no request a step can take, and there is no cut.  A cell whose prompts come from a
source has no one request size; it is left out.  Nor where the miss is larger than one request
fewer could cure: where a decode step's time grows with its batch, n - 1 requests decode in no
less than (n - 1) / n of the time n take, so a run of n requests in flight that missed by more
than n / (n - 1) is not cut.  Without that bound, seed 2 spent most of its last fourteen turns
cutting runs that had missed by 10-17% with thirteen 6k requests in flight, down to runs at
1075 tok/s that still missed, and never turned graphs on at its incumbent (1022 tok/s; 1165
with graphs).  A request is counted without a chat template (`tuner.search.bounds.
TEMPLATE_TOKENS` is the most one adds): counted with one, seed 5's cut went to 81.5k tokens,
where thirteen still fit and the run missed as before.  Counted without, a cut holds one
request fewer where the prompts carry no template, and at worst as many where they do: then
its run measures the same miss, and the next cut goes from there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution

from tuner.study.miss_descent import Tops, per_token, top, worst
from tuner.study.record import KV_SHARE, TrialRecord, config_key
from tuner.study.step_shape import held
from tuner.trial.kv_share import KvEdge
from tuner.trial.memory_estimate import knobs_from_params


def missed_above(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
                 sign: float, best: float, discounted: bool = False) -> list[TrialRecord]:
    """The runs that missed a per-token SLO most with a better objective than `best` (the
    incumbent's, times `sign`), over every knob of `space`: the better first.  `discounted`:
    the objective as a cure could keep it, scaled down by the miss (module doc)."""
    out = []
    for t in trials:
        if t.outcome != "slo" or not t.original or not t.values \
                or not space.keys() <= t.params.keys() or not per_token(worst(t)[0]):
            continue
        ratio = math.exp(worst(t)[1]) if discounted else 1.0
        value = t.values[0] / ratio if sign > 0 else t.values[0] * ratio
        if sign * value > best:
            out.append((-sign * t.values[0], t.number, t))
    return [t for *_, t in sorted(out, key=lambda r: r[:2])]


def topped(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
           tops: Tops, sign: float, best: float) -> list[dict[str, Any]]:
    """Each of the `missed_above` runs with its `tops` at the top of their range."""
    out = []
    for t in missed_above(trials, space, sign, best):
        params = {k: t.params[k] for k in space}
        if moved := {n: top(space[n]) for n in tops(params)}:
            out.append({**params, **moved})
    return out


def faster(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
           fast: Sequence[str], sign: float,
           best: float) -> list[tuple[TrialRecord, dict[str, Any]]]:
    """Each of the `missed_above` runs, discounted, with one of the `fast` knobs it has off
    turned on: (the run, the params); one per config, its pool aside (module doc)."""
    out, seen = [], set()
    for t in missed_above(trials, space, sign, best, discounted=True):
        params = {k: t.params[k] for k in space}
        key = config_key({k: v for k, v in params.items() if k != KV_SHARE})
        if key not in seen:
            seen.add(key)
            out += [(t, {**params, name: True}) for name in fast
                    if name in space and params[name] is not True]
    return out


def one_fewer(params: Mapping[str, Any], edge: KvEdge, over: float = 1.0) -> int | None:
    """The KV knob's value, on its grid, for the largest pool that holds one request fewer of
    some cell than `params`' pool does, where that cell's requests in flight are bounded by
    the pool (below the cell's concurrency, the batch and decode caps), and more than one
    fits, so many that one fewer could cure a miss of `over` (value over limit, module doc);
    the largest over such cells.  None where no cell is so bounded."""
    knobs = knobs_from_params(edge.space, dict(params))
    if knobs.kv_tokens is None:
        return None
    block = max(knobs.block_size, 1)
    tokens = []
    for cell in edge.cells:
        if cell.source is not None:
            continue
        request = -(-(cell.input_len + cell.output_len) // block) * block   # no template
        fits = knobs.kv_tokens // request
        if 2 <= fits < min(held(cell), knobs.decode_limit) and over <= fits / (fits - 1):
            tokens.append(fits * request - block)   # whole blocks: fits - 1 requests
    if not tokens:
        return None
    low, _, step = edge.grid(params)
    want = max(tokens) if edge.param.role == "kv_tokens" else max(tokens) // block
    value = low + (want - low) // step * step
    return value if low <= value < int(params[edge.param.name]) else None


def fewer_repairs(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
                  edge: KvEdge | None, sign: float,
                  best: float) -> list[tuple[dict[str, Any], int]]:
    """Each of the `missed_above` runs, discounted, at the pool `one_fewer` gives it: (params
    with the share that renders that pool, the pool)."""
    if edge is None or KV_SHARE not in space:
        return []
    out = []
    for t in missed_above(trials, space, sign, best, discounted=True):
        if edge.param.name in t.params and \
                (pool := one_fewer(t.params, edge, math.exp(worst(t)[1]))) is not None:
            rest = {k: t.params[k] for k in space if k != KV_SHARE}
            out.append(({**rest, KV_SHARE: edge.share_of(rest, pool, trials)}, pool))
    return out

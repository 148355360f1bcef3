"""Flips: the incumbent with one categorical knob changed, run as a controlled test at its pool.

Why untried flips: the proposals' memory filter can hide a whole choice.  On Llama-3.1-70B /
H200 (benchmarks/search_efficiency.py) the calibrated estimate put every CUDA-graph config over
the card, so no study ever launched one, while the incumbent with graphs switched on ran in 3 of
6 seeds and was 8% faster.  So a categorical choice that no launched trial has had yet is first
tried as a one-knob flip of the incumbent, whatever the memory model says.  A choice the filter
has turned away is flipped as soon as a healthy config exists, in the start-up too: on
Llama-3.2-1B / RTX 3090 the best configs need CUDA graphs, and 10 trials reached 0.72 of the
best without that, 1.00 with it.  A choice that no trial launched only because the few draws so
far did not happen to is no such case: it is ranked with the controlled flips below (until
2026-12-03 every never-launched choice went first, and 10-trial studies spent their three local
turns on flat knobs while the CUDA-graph flip waited; benchmarks/results/search_efficiency.md,
round 16).

Why controlled flips: a choice that was launched is not yet a choice that was compared.  The
categoricals of these spaces interact (a long-context guard of 1024 tokens costs a third of the
throughput with one prefill budget and little with another), and TPE judges a choice by the
trials that happened to carry it.  On the 8B / RTX 4090 scenario seeds ended 40 trials with
graphs off or a 1024-token guard in the incumbent, 12-31% under the best, although both choices
had been launched.  So every choice is tested once against another as a pair of healthy runs
that differ in that knob alone, the most promising choice first.

Why breadth first: a knob with many choices (five block sizes, four long-context guards) took
one local turn per choice, each a run that differs from the incumbent in that knob alone, while
a two-way knob such as CUDA graphs waited behind them.  So every knob is flipped once before any
knob is flipped again, two-way knobs first.  Measured against depth first (40 seeds per
scenario, mean best/reference at 20 / 30 / 40 measured trials): 8B / RTX 4090 .888 / .931 / .942
-> .900 / .928 / .949, Mistral-7B / A100 .692 / .860 / .935 -> .707 / .890 / .942, Qwen2.5-7B /
L40S .809 / .897 / .945 -> .797 / .890 / .946: small, within the seeds' spread on Qwen.
Within a knob whose choices are ordered numbers (block sizes, guard lengths), the choice
farthest from the incumbent's comes first: the largest change is the one a single run tells
most about.  Mistral-7B's best configs all have the last of four guard lengths; farthest first
took its mean at 20 / 30 / 40 trials (30 seeds) from .693 / .895 / .950 to .783 / .917 / .958,
8B and Qwen moved by under 0.015 either way, 70B's mean not at all (three digits).

Why companions: a flip can run out of memory, or fail to start, where the same flip with
another categorical changed would run.  On Llama-3.1-70B / H200 graphs with 32-token blocks ran
out of memory, graphs with 128-token blocks ran and were 7% faster; the graph flip of an
incumbent with small blocks ran out, its calibration then put every graph config over the card,
and 2 of 3 seeds ended 40 trials at 0.93 of the best.  So a flip that ran out of memory is
tried again with one more categorical knob changed, the pair the memory model gives the most
room first.  On 70B / H200 (30 seeds) the median at 30 measured trials rose from 0.93 to 1.00
of the best known, at the cost of more OOM launches (26% of the trials after the first 5, from
19%); the other scenarios never met such a flip and ran unchanged.  Since the flip can also be
paired with a lowered number (`tuner.study.pool_trades.reliefs`), only pairs the model says can
fit are tried: on the 70B / H200 scenario the others ran out of memory one after another (one
study launched the graph flip with four block sizes in turn; each OOM).  A flip that failed to
start is paired the same way: the seed's RTX 4090 compiled block size 128 without CUDA graphs
but not with them, and on the 8B / RTX 4090 scenario an incumbent with 128-token blocks had
its graph flip fail twice and never tried graphs at another block size (in one study, which
ended 40 trials at 0.88 of the best).

Why winners again: a comparison settles a knob for the incumbent it was made on, not for the
next one.  On Llama-3.2-1B / RTX 3090 (8k-24k prompts) CUDA graphs won their comparison by 40%
early on; the next incumbents were all found without graphs, TPE's good trials agreed on "off",
and a seed ended 40 trials at 0.84 of the best with graphs never tried on its incumbent.  So a
choice that won more comparisons against the incumbent's choice than it lost is flipped again,
before any other flip; once it has lost at the new incumbent too, it is not.

Why repairs: a run that missed the SLOs is no incumbent, so no flip starts from it, however
much it measured.  On Llama-3.2-3B / A100 (RAG prompts, p99 TTFT <= 8 s) the start-up's
caps-open corner drew decode-first in 3 of 10 seeds and missed the TTFT SLO at 14 s; the
incumbent was then a config with a batch or decode cap of 3, the decode-first flip of it missed
the SLO too, and the 10-trial studies spent their other turns flipping that incumbent's flat
knobs, ending at 0.38-0.70 of the best (random search reached 0.62-0.83 on those seeds).  The
corner without decode-first meets the SLO at 0.78-0.79 of the best.  So once a comparison has
shown that a choice loses (here: misses the SLO where the other choice met it), a run that
missed the SLOs with that choice, at a better objective than the incumbent's, is run with the
winning choice, before any other flip (`repairs`; at that run's pool, as a flip of it).

Why flat knobs are not flipped again: many knobs do nothing on a given workload (prefix
caching without shared prefixes, a long-context guard above every prompt, the block size once
the pool is large).  Flipped choice by choice, they took most of the local turns: on
Qwen2.5-7B / L40S, six of the eight flips from trial 10 to 24 of one seed measured the
incumbent's throughput again to the last digit.  So a knob whose every comparison so far moved
the objective by at most `FLAT` is not flipped again; TPE still draws it.  1% is under the
run-to-run spread of one tuned config on the H200 (133.2-134.8 and 145.2-148.1 tok/s, 1.2% and
2.0%: benchmarks/results/h200-transformers-8b-r8 and h200-transformers-8b), so on a real
server a flat knob is one whose flips measured noise.  Measured on 30 seeds
(benchmarks/search_ab.py): Qwen mean at 30 trials .895 -> .924 (10th percentile .789 -> .873);
the other scenarios moved by .009 or less, Mistral-7B at 40 down by that much.

Why at the incumbent's pool: the share of the headroom renders a smaller pool for a config the
model thinks needs more memory.  A flip to CUDA graphs drawn at the incumbent's share ran at
two thirds of its pool on the 8B / RTX 4090 scenario (a galloping forward scale after one graph
OOM) and measured the smaller pool, not the graphs.  A flip keeps the incumbent's pool unless
the study's edge for the flipped knobs is lower; then it runs at that edge.  Pinning the pool
above it, up to the smallest forward scale the OOMs had not ruled out, was the intent until
2026-12-01, but the pin never reached the trial (the pipeline made a new KV renderer per call,
and the share rendered the pool back, stopping at the edge); with the pin working it measured
worse on 30 seeds (benchmarks/search_ab.py: Llama-3.2-1B mean at 30 trials .963 -> .948,
Mistral-7B at 40 .953 -> .936, Llama-3.1-70B at 40 .970 -> .963), so the flip stays at the
edge, as every figure above was measured.

Why a flip that frees memory runs at its own edge: the other way round, a flip can need less
memory than the incumbent, and on a KV-bound workload the memory it frees is its gain.  On
Mistral-7B / RTX 3090 (32 requests of 1.5k + 512 tokens, p90 E2EL <= 60 s; benchmarks/
search_scenarios.py, v-mistral-3090-e2el) CUDA graphs off measured 465 tok/s at the incumbent's
26.1k tokens against graphs on at 504, and 514 at their own edge (28.2k tokens: the graph
pool's memory holds KV); five of ten seeds ended 30 trials with graphs on, at 0.963-0.968 of
the best.  So where the incumbent ran at its edge, the flip runs at the incumbent's pool plus
what the model says the flip frees (the difference of the two configs' modelled edges: where
OOMs put the incumbent's edge under its modelled one, the model errs as much for a neighbour
that differs in one knob), up to the flip's own edge, where that is more than `EDGE_TOL` above the
pool.  Only where the flip's forward, at the incumbent's pool and at the new one, is no smaller
than the incumbent's: the memory it frees is then outside the forward (the runtime each
choice's runs calibrate), while a forward the model shrinks is the estimate's guess.  Run at
their own edge, long-context-guard flips (the model's forward shrinks) ran out of memory three
times in one study of Mistral-7B / RTX 4090 (open loop), decode-first flips of Qwen2.5-7B /
RTX 3090 four times in a row (a larger pool gave the estimate's peak forward another form, with
a smaller scale), and with the check at the new pool alone, guard flips of Mistral-7B / RTX
3090 (RAG) three times (the larger pool's forward hid that the guard's was smaller).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from tuner.study.record import KV_SHARE, TrialRecord, config_key
from tuner.trial.kv_share import EDGE_TOL, KvEdge, others_key

FLAT = 0.01   # a flip that moved the objective by at most this share settled its knob as flat


def untried_flips(params: Mapping[str, Any], trials: Sequence[TrialRecord],
                  space: Mapping[str, BaseDistribution]) -> list[dict[str, Any]]:
    """`params` with one categorical knob set to a choice no launched trial has had."""
    launched = [t.params for t in trials if not t.unmeasured]
    out = []
    for name, dist in space.items():
        if not isinstance(dist, CategoricalDistribution) or name not in params:
            continue
        for choice in dist.choices:
            if choice != params[name] and all(p.get(name) != choice for p in launched):
                out.append({**params, name: choice})
    return out


def controlled_flips(params: Mapping[str, Any], trials: Sequence[TrialRecord],
                     space: Mapping[str, BaseDistribution], kv_name: str | None,
                     sign: float) -> list[dict[str, Any]]:
    """`params` with one categorical knob set to a choice that no two healthy runs have
    compared alone (the same other knobs, the KV pool aside), or to one that won more such
    comparisons against `params`' choice than it lost (see module doc).  Winners first; then
    knob by knob, breadth first: a knob none of whose choices was compared comes before
    another choice of a knob that was, and the knob with fewer choices first (one flip settles
    a two-way knob); within a knob, the choice farthest along its order first (numbers only),
    then the most promising: by the best value (times `sign`: larger is better) a feasible
    trial with it reached."""
    cats = _categoricals(params, space)
    pairs, score = _comparisons(trials, cats, kv_name, sign)
    compared = {(n, c) for (n, _), cs in pairs.items() if len(cs) > 1 for c in cs}
    settled = {n for n, _ in compared}
    out = []
    for name, choices in cats.items():
        if _flat(pairs, name):
            continue
        for choice in choices:
            if choice == params[name]:
                continue
            won = _net_wins(pairs, name, choice, params[name]) > 0
            if (name, choice) not in compared or won:
                rank = (not won, name in settled, len(choices),
                        -_distance(choices, params[name], choice),
                        -score.get((name, choice), -math.inf))
                out.append((rank, {**params, name: choice}))
    out.sort(key=lambda rc: rc[0])
    return [c for _, c in out]


def repairs(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
            kv_name: str | None, sign: float,
            best: float) -> list[tuple[TrialRecord, dict[str, Any]]]:
    """Runs that missed the SLOs with a better objective than `best` (the incumbent's, times
    `sign`), each with one categorical knob set to a choice that won more comparisons against
    that run's choice than it lost (see module doc): (the run, the repaired params), the
    run with the better objective first, then the choice with more net wins."""
    cats = _categoricals(space, space)     # a run repaired sets every knob of the space
    pairs, _ = _comparisons(trials, cats, kv_name, sign)
    out = []
    for t in trials:
        value = sign * t.values[0] if t.values else -math.inf
        if t.outcome != "slo" or not t.original or value <= best or \
                not space.keys() <= t.params.keys():
            continue
        params = {k: t.params[k] for k in space}
        for name, choices in cats.items():
            for choice in choices:
                net = _net_wins(pairs, name, choice, params[name]) if choice != params[name] else 0
                if net > 0:
                    out.append(((-value, -net), t, {**params, name: choice}))
    out.sort(key=lambda r: r[0])
    return [(t, cand) for _, t, cand in out]


def _categoricals(params: Collection[str],
                  space: Mapping[str, BaseDistribution]) -> dict[str, Sequence[Any]]:
    """The space's categorical knobs among `params` (names), with their choices."""
    return {n: d.choices for n, d in space.items()
            if isinstance(d, CategoricalDistribution) and n in params}


def _comparisons(trials: Sequence[TrialRecord], cats: Mapping[str, Sequence[Any]],
                 kv_name: str | None, sign: float
                 ) -> tuple[dict[tuple[str, str], dict[Any, float]], dict[tuple[str, Any], float]]:
    """The healthy runs grouped per categorical knob by the rest of their config (the KV pool
    aside): (knob, the rest) -> choice -> best value times `sign` (-inf: missed the SLOs); and
    per (knob, choice) the best feasible value a run with it reached."""
    pairs: dict[tuple[str, str], dict[Any, float]] = {}
    score: dict[tuple[str, Any], float] = {}
    for t in trials:
        if t.unmeasured or t.outcome not in ("ok", "slo"):
            continue
        value = sign * t.values[0] if t.feasible and t.values else -math.inf
        for name in (n for n in cats if n in t.params):
            rest = {k: v for k, v in t.params.items() if k not in (name, kv_name)}
            group = pairs.setdefault((name, config_key(rest)), {})
            group[t.params[name]] = max(group.get(t.params[name], -math.inf), value)
            if value > -math.inf:
                key = (name, t.params[name])
                score[key] = max(score.get(key, -math.inf), value)
    return pairs, score


def _net_wins(pairs: Mapping[tuple[str, str], Mapping[Any, float]], name: str, a: Any,
              b: Any) -> int:
    """Comparisons of knob `name` that choice `a` won against `b`, less those it lost."""
    net = 0
    for (n, _), group in pairs.items():
        if n == name and a in group and b in group and group[a] != group[b]:
            net += 1 if group[a] > group[b] else -1
    return net


def _flat(pairs: Mapping[tuple[str, str], Mapping[Any, float]], name: str) -> bool:
    """Whether every comparison of knob `name` so far left the objective within `FLAT` (and at
    least one was made): see module doc."""
    groups = [list(g.values()) for (n, _), g in pairs.items() if n == name and len(g) > 1]
    return bool(groups) and all(
        min(vs) > -math.inf and max(vs) - min(vs) <= FLAT * max(abs(v) for v in vs)
        for vs in groups)


def _distance(choices: Sequence[Any], a: Any, b: Any) -> int:
    """How many steps apart two choices of an ordered (numeric) knob are; 0 for other knobs."""
    ordered = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)
    return abs(choices.index(a) - choices.index(b)) if ordered and a in choices else 0


def fell_over(cand: Mapping[str, Any], trials: Sequence[TrialRecord],
              kv_name: str | None) -> bool:
    """Whether `cand` was launched (at any KV pool) and ran out of memory or never started."""
    key = others_key(cand, kv_name)
    return any(t.outcome in ("oom", "startup") and others_key(t.params, kv_name) == key
               for t in trials)


def companions(cand: Mapping[str, Any], base: Mapping[str, Any],
               space: Mapping[str, BaseDistribution],
               slack: Callable[[dict[str, Any]], float]) -> list[dict[str, Any]]:
    """`cand`, a flip of `base`, with one more categorical knob changed: every such pair, the
    one whose need leaves the most room on the card (`slack`) first (the proposals try those
    with room: `tuner.study.pool_trades.pairs_of`)."""
    flipped = {k for k in cand if cand[k] != base.get(k)}
    out = []
    for name, dist in space.items():
        if isinstance(dist, CategoricalDistribution) and name in cand and name not in flipped:
            out += [{**cand, name: c} for c in dist.choices if c != cand[name]]
    return sorted(out, key=slack, reverse=True)


def at_pool(cand: dict[str, Any], top: TrialRecord, edge: KvEdge | None,
            trials: Sequence[TrialRecord]) -> tuple[dict[str, Any], int | None]:
    """A flip of the incumbent `top` with its share set to run at `top`'s pool where the
    study's edge allows, or above it where the flip frees memory (see module doc), and that
    pool; (cand, None) without a KV edge."""
    if edge is None or KV_SHARE not in cand or edge.param.name not in top.params:
        return cand, None
    rest = {k: v for k, v in cand.items() if k != KV_SHARE}
    held, own = int(top.params[edge.param.name]), edge.edge(rest, trials)
    pool = min(edge.carried(held, top.params, rest), own)
    ran = dict(top.params)
    if held >= edge.edge(ran, trials):   # a flip that frees memory: see module doc
        gain = edge.modelled(rest, trials) - edge.carried(edge.modelled(ran, trials), ran, rest)
        target = edge.within_demand(rest, min(own, pool + gain))
        if target > pool * (1 + EDGE_TOL) and min(
                edge.forward(rest, v, trials) for v in (pool, target)) >= \
                edge.forward(ran, held, trials):
            pool = target
    return {**cand, KV_SHARE: edge.share_of(rest, pool, trials)}, pool

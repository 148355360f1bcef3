"""Ascent moves: the incumbent with every number that the runs so far rank with the objective
moved one step that way (steepest ascent on ranks).

Why: where several caps must all be opened together, one-or-two-knob neighbours and the
pattern move climb one knob at a time.  On Qwen2.5-7B / L40S (benchmarks/search_efficiency.py)
the best configs have both batch caps at 128, the prefill cap at 46-64 and a prefill budget
above 18k tokens; one seed's incumbent from trial 21 to 40 had caps of 83, 85 and 2 (0.92 of
the best), and of its local moves after trial 26 none moved more than two knobs.  So each
number's positions (on its own scale) are rank-correlated with the runs' merit, and every
number whose Spearman correlation is significant (|rho| above 2 / sqrt(n), about the 5% level)
moves `STEP_SCALE` of its range its way; the pattern move then repeats a step that paid.  The
merit ranks a run that met its SLOs above one that missed them, by the objective, and a miss by
how far it missed (a run that missed the SLO still says which way the caps help).

The proposals make one ascent per incumbent, after its flips (`tuner.study.proposals`).  Made
before the flips, and from the run that missed its SLO least while nothing was feasible, it was
worse on 20 seeds (benchmarks/search_ab.py): Mistral-7B / A100 mean at 20 trials .836 -> .734,
8B / RTX 4090 at 40 .958 -> .930, though Qwen at 20 rose .772 -> .844.

While no run has met the SLOs there is no incumbent, nothing to flip or trade, and TPE alone
proposed: on Mistral-7B / A100 one seed missed the TPOT SLO in its first 29 trials.  So a
local turn then climbs from the run that missed least, once per such run.  On 40 seeds of that
scenario the mean at 20 / 30 / 40 trials went .775 / .918 / .961 -> .762 / .938 / .972 (10th
percentile at 30 .783 -> .897); Qwen, 1B, 8B and 70B, which meet their SLOs during the
start-up, did not change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection

from tuner.study.local_moves import STEP_SCALE, position, shift
from tuner.study.record import KV_SHARE, TrialRecord

MIN_RUNS = 5    # fewer healthy runs rank nothing (2 / sqrt(5) = 0.89 is already demanding)


def ascent_move(trials: Sequence[TrialRecord], directions: Sequence[StudyDirection],
                space: Mapping[str, BaseDistribution]) -> tuple[int, dict[str, Any]] | None:
    """(the number of the best run by merit, that run with every significantly ranked number
    moved a step: see module doc); None with several objectives, too few runs, or no such
    number."""
    if len(directions) != 1:
        return None
    sign = 1.0 if directions[0] == StudyDirection.MAXIMIZE else -1.0
    runs = [t for t in trials if t.outcome in ("ok", "slo") and t.original and t.values
            and all(k in t.params for k in space)]
    if len(runs) < MIN_RUNS:
        return None
    merit = ranks([_merit(t, sign) for t in runs])
    top = runs[max(range(len(runs)), key=lambda i: merit[i])]
    base = {k: top.params[k] for k in space}
    move = dict(base)
    for name, dist in space.items():
        if name == KV_SHARE or dist.single() or not isinstance(dist, (IntDistribution,
                                                                      FloatDistribution)):
            continue
        rho = pearson(ranks([position(t.params[name], dist) for t in runs]), merit)
        if abs(rho) > 2 / math.sqrt(len(runs)):
            move[name] = shift(move[name], dist, math.copysign(STEP_SCALE, rho))
    return (top.number, move) if move != base else None


def _merit(t: TrialRecord, sign: float) -> tuple[int, float]:
    """SLOs met first, by the objective; a miss by how little it missed."""
    if t.feasible and t.values:
        return 1, sign * t.values[0]
    return 0, -sum(max(0.0, v) for k, v in t.constraints.items() if k.startswith("slo:"))


def ranks(values: Sequence[Any]) -> list[float]:
    """Ranks from 0, ties at their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            out[k] = (i + j) / 2
        i = j + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's correlation; 0 when either side does not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return 0.0 if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)

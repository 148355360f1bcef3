"""Dead choices: categorical choices, alone or in pairs, that the server refuses to start with.

Why: a value the server rejects costs a launch every time it is proposed (the seed's block size
128 did not compile), and the memory model cannot see it.  A choice that failed to start in
`DEAD_AFTER` trials and never started is dead, whatever the rest.  Why pairs: the seed's RTX
4090 compiled block size 128 without CUDA graphs but not with them, and the simulator models
that.  Neither choice is dead alone, so the 8B / RTX 4090 scenario of
benchmarks/search_efficiency.py kept launching the pair: the block-size flip of an incumbent
with graphs failed to start, then its companions (the flip with one more categorical changed)
failed one after another, 30 start-up failures in 400 trials, 9 in one study.  So two choices
that failed to start together in `DEAD_AFTER` trials and never started together, each having
started without the other, are a dead pair.  A choice or pair is not blamed while a
never-started choice was in every one of its failures (either could be the cause).  A dead
choice or pair is never proposed again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution

from tuner.study.record import TrialRecord

DEAD_AFTER = 2  # start-up failures, with no start, that mark a choice or a pair dead

Choice = tuple[str, Any]
Dead = set[tuple[Choice, ...]]     # each entry: one choice, or two that are dead together


def dead_choices(trials: Sequence[TrialRecord],
                 search_space: Mapping[str, BaseDistribution]) -> Dead:
    """The dead choices and pairs (see module doc): one-tuples and two-tuples of choices."""
    choices = [(n, c) for n, d in search_space.items() if isinstance(d, CategoricalDistribution)
               for c in d.choices]
    launched = [t for t in trials if t.outcome != "skipped"]
    never = {ch for ch in choices if _never_started(launched, (ch,))}
    out: Dead = set()
    for ch in never:
        failed = [t for t in launched if _has(t.params, (ch,))]
        if len(failed) >= DEAD_AFTER and _suspects(failed, never) == {ch}:
            out.add((ch,))
    failures = [t for t in launched if t.outcome == "startup"]
    for a, b in itertools.combinations(sorted({ch for t in failures for ch in choices
                                               if _has(t.params, (ch,))} - never, key=repr), 2):
        if a[0] == b[0]:
            continue
        failed = [t for t in launched if _has(t.params, (a, b))]
        if (len(failed) >= DEAD_AFTER and _never_started(launched, (a, b))
                and not _suspects(failed, never)):
            out.add((a, b))
    return out


def avoiding(dead: Collection[tuple[Choice, ...]],
             slack: Callable[[dict[str, Any]], float]) -> Callable[[dict[str, Any]], float]:
    """`slack`, but minus infinity for a config with a dead choice or pair."""
    if not dead:
        return slack
    return lambda params: (-math.inf if any(_has(params, combo) for combo in dead)
                           else slack(params))


def _has(params: Mapping[str, Any], combo: Sequence[Choice]) -> bool:
    return all(n in params and params[n] == c for n, c in combo)


def _never_started(launched: Sequence[TrialRecord], combo: Sequence[Choice]) -> bool:
    return all(t.outcome == "startup" for t in launched if _has(t.params, combo))


def _suspects(failed: Sequence[TrialRecord], never: set[Choice]) -> set[Choice]:
    """The never-started choices present in every one of `failed`."""
    return set.intersection(*({ch for ch in never if _has(t.params, (ch,))} for t in failed))

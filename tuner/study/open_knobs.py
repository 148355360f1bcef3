"""The knobs a queued config leaves open, drawn where the config can run.

Why: the server-default trial (trial 0) fixes the knobs the space gives a default and leaves the
rest to the sampler, whose draw knew nothing of memory.  On an H100 capped at 12 GiB
(transformers serve, Llama-3.2-3B shape: benchmarks/results/h100-transformers-3b-rag-r29) the
draw was a 5365-token forward budget; with it not even the smallest KV pool fitted, the
pre-screen skipped trial 0, and the study had no default to compare its pick with.  Trial 0 is
to be the server's default where it can run and otherwise the nearest config that can, so the
open knobs are drawn together, up to `TRIES` times, from the wrapped sampler, and the first draw
the study's memory model says fits wins (at the pool the config was queued with, else at the
smallest); if none fits, the one that came closest.  The given knobs are never changed.  The
first draw is the one the sampler made before, so a default that fitted runs as it did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.study.record import kv_value, records
from tuner.trial.kv_share import KvEdge

TRIES = 16      # draws of the open knobs at most, as for a proposal (`tuner.study.proposals`)

Draw = Callable[[str, BaseDistribution], Any]
Room = Callable[[dict[str, Any]], float]


def drawn(study: optuna.Study, trial: FrozenTrial, edge: KvEdge, draw: Draw) -> dict[str, Any]:
    """The open knobs of the queued `trial`, each drawn by `draw` (the wrapped sampler's
    independent draw), where the config fits by `edge`'s memory model."""
    given = dict(trial.system_attrs["fixed_params"])
    kv = edge.param.name
    dists = {p.name: p.distribution() for p in edge.space.parameters
             if p.name not in given and p.name != kv}
    if not dists:
        return {}
    trials = records(study, (TrialState.COMPLETE,))
    pool = kv_value(trial)
    if pool is None:   # queued without a pool: it must fit at the smallest
        return fill(dists, given, draw, edge.slack_of(trials))
    at = edge.room_at(trials)
    return fill(dists, given, draw, lambda params: at(params, pool))


def fill(open_knobs: Mapping[str, BaseDistribution], given: Mapping[str, Any], draw: Draw,
         room: Room, tries: int = TRIES) -> dict[str, Any]:
    """Values for `open_knobs`, drawn in their order by `draw`: the first draw whose config
    (`given` plus the draw) has `room` >= 0, else the one with the most room."""
    best: dict[str, Any] = {}
    best_room = -math.inf
    for _ in range(tries):
        cand = {name: draw(name, dist) for name, dist in open_knobs.items()}
        r = room({**given, **cand})
        if r > best_room or not best:
            best, best_room = cand, r
        if r >= 0:
            break
    return best

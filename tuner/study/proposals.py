"""The tuner's proposals: the sampler's candidates filtered by the memory model, and from its
start-up on, every second proposal a neighbour of the incumbent.

Why the filter: where most of the space cannot run at all (Llama-3.1-70B on an H200 leaves
~9 GiB beside the weights; only a long-context guard with decode-first survives the 8k prompts,
~5% of the space), TPE learns the feasible region from one OOM per measured trial and spent
whole 40-trial budgets on launches that died.  The study's own memory model
(`tuner.trial.kv_share`: the estimate with its runtime and forward scale calibrated from the
OOMs and healthy runs seen) already knows most of that region.  So a proposal is drawn up to
`TRIES` times from the wrapped sampler (during its start-up, from `tuner.study.design`: a
Latin hypercube that fits by the estimate) and the first candidate whose calibrated need fits
the card at the smallest KV pool wins; if none does, the one closest to fitting.  The filter
ranks, it never forbids: the estimate can be wrong, and the outcome of a config it misjudged
corrects the calibration.  The KV pool itself is still drawn as a share of the headroom the
chosen knobs leave.  Enqueued configs are never changed; the knobs they leave open are
drawn where the config fits (`tuner.study.open_knobs`).

Why the neighbours: see `tuner.study.flips` (one categorical changed, at the incumbent's pool;
first, a run that missed the SLOs above the incumbent repaired by a choice that won elsewhere),
`tuner.study.pool_trades`, `tuner.study.ascent`, `tuner.study.local_moves` and, for runs that
missed a TTFT SLO at a small pool, `tuner.study.edge_pushes`.  TPE finds the
region, the local moves finish the walk; alternating keeps TPE's global view alive for a second
region.  In the last third of the measured trials every turn is a local one: a global draw pays
off through the local moves after it, and near the end there are none left.  There the turns
that would have been draws (odd trial numbers) move a number first, the others flip a choice
first: an incumbent has a dozen untried flips, and taking them all first spent every last
turn of 30-trial studies on them (on the fresh Mistral-7B / RTX 4090 scenario one seed ended
at 0.90 of the best with a decode cap of 19 beside 48 requests in flight, ten flips run and
the cap never raised; `tuner.study.open_caps`).  In 10-trial
studies the TPE draws of trials 5, 7 and 9 (three to nine observations) were configs with a
batch or decode cap of 1-5; with the last third local, the worst seed at 10 trials rose on six
of the eight scenarios of benchmarks/search_efficiency.py (round 16), and beats-random at 10
went 8 -> 9 of 10 seeds on Llama-3.2-1B / RTX 3090 and 8 -> 10 on Qwen2.5-7B / H100.

The 70B / H200 and 1B / RTX 3090 figures here predate the simulator fix of 2026-12-01 (round 7).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Collection, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from tuner.study import design, open_knobs
from tuner.study.ascent import ascent_move
from tuner.study.dead_choices import Dead, avoiding, dead_choices
from tuner.study.edge_pushes import at_edge, promising, unmet_moves, waits
from tuner.study.flips import (
    at_pool,
    controlled_flips,
    fell_over,
    repairs,
    untried_flips,
)
from tuner.study.local_moves import (
    distinct,
    fresh_in,
    incumbents,
    inert_knobs,
    neighbour,
    pattern_move,
)
from tuner.study.miss_descent import (
    budget_tops,
    deferring,
    descent_moves,
    held_pool,
    packings,
    policies,
    speeds,
)
from tuner.study.open_caps import cap_moves, cap_targets, raised_budget
from tuner.study.per_token_repairs import faster, fewer_repairs, topped
from tuner.study.pool_trades import failed_trades, pairs_of, pool_trade, trades_of
from tuner.study.record import TrialRecord, records
from tuner.study.trade_bisection import bisected
from tuner.trial.kv_share import KvEdge

TRIES = 16      # candidates drawn per proposal at most (one TPE draw costs ~10 ms)

Slack = Callable[[dict[str, Any]], float]
Local = tuple[dict[str, Any], int | None]   # a local move's params, and the pool it is pinned to
SlackOf = Callable[[Sequence[TrialRecord]], Slack]


def _fits_always(trials: Sequence[TrialRecord]) -> Slack:
    return lambda params: 0.0


class GuidedSampler(BaseSampler):
    """Wraps a sampler (see module doc).  `slack_of(trials)` returns a function of a config's
    params: the card's bytes left over by the calibrated need at the smallest KV pool (>= 0:
    it can fit).  `startup`: the wrapped sampler's start-up length; local moves begin there."""

    def __init__(self, base: BaseSampler, slack_of: SlackOf | None, startup: int,
                 seed: int | None = None, edge: KvEdge | None = None,
                 limits: Collection[str] = (), budgets: Collection[str] = (),
                 trials: int | None = None) -> None:
        self._base = base
        # measured trials from which every turn is a local move (see module doc)
        self._final = None if trials is None else trials - trials // 3
        self._slack_of = slack_of or _fits_always
        self._startup = startup
        self._edge = edge
        self._rng = random.Random(seed)
        self._design = design.StartupDesign(startup, self._rng, limits)
        self._limits = tuple(limits)
        self._budgets = set(budgets)   # lowered first by a floor relief the model cannot rank
        self.turned_away: list[dict[str, Any]] = []   # candidates the memory model rejected
        self._ascended: set[int] = set()   # runs an ascent move started from
        self._open: dict[int, dict[str, Any]] = {}   # queued trial -> its open knobs' draw

    @property
    def base(self) -> BaseSampler:
        return self._base

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return self._base.sample_relative(study, trial, search_space)
        trials = records(study, (TrialState.COMPLETE,))
        dead = dead_choices(trials, search_space)
        slack = avoiding(dead, self._slack_of(trials))
        # alternate by trial number: handed out atomically, so workers of one study alternate too
        final = self._final is not None and sum(t.budgeted for t in trials) >= self._final
        if trial.number % 2 == 0 or final:
            local = self._local(trials, study.directions, search_space, slack, dead,
                                start_up=len(trials) < self._startup,
                                numbers_first=trial.number % 2 == 1)
            if local is not None:
                params, pool = local
                if pool is not None and self._edge is not None:
                    self._edge.pinned[trial.number] = pool
                return params
        best: dict[str, Any] = {}
        best_slack = -math.inf
        rejected = []
        for _ in range(TRIES):
            params = self._draw(study, trial, search_space)
            s = slack(params)
            if s > best_slack or not best:
                best, best_slack = params, s
            if s >= 0:
                break
            if s > -math.inf:
                rejected.append(params)
        self.turned_away += [p for p in rejected if p is not best]
        return best

    def _local(self, trials: Sequence[TrialRecord], directions: Sequence[Any],
               search_space: dict[str, BaseDistribution], slack: Slack,
               dead: Dead, start_up: bool, numbers_first: bool = False) -> Local | None:
        """A neighbour of an incumbent that was not run yet, and the pool to pin it to (flips
        only): a flip (`_flip`), else, after the start-up, a move of the numbers (`_numeric`),
        or the other way round where `numbers_first` (see module doc);
        while no run met the SLOs, a waiting trade or an ascent (`_unmet`); None if none was
        found."""
        top = self._incumbent(trials, directions, search_space, start_up)
        if top is None:   # nothing met the SLOs yet: climb from the run that missed least
            return None if start_up else self._unmet(trials, directions, search_space, slack)
        if not start_up:   # the incumbent at its edge, else a run that could beat it there
            fresh = fresh_in(trials, self._edge)
            for run in [top, *promising(top, trials, self._edge, search_space, directions)]:
                if (pushed := at_edge(run, trials, search_space, self._edge)) is not None \
                        and fresh(pushed, slack):
                    return pushed, None
        if numbers_first and not start_up:
            found = self._numeric(top, trials, directions, search_space, slack)
            if found is not None:
                return found
        found = self._flip(top, trials, directions, search_space, slack, dead, start_up)
        if found is not None or start_up:
            return found
        return self._numeric(top, trials, directions, search_space, slack)

    def _flip(self, top: TrialRecord, trials: Sequence[TrialRecord], directions: Sequence[Any],
              search_space: dict[str, BaseDistribution], slack: Slack, dead: Dead,
              start_up: bool) -> Local | None:
        """First a choice never launched that the memory filter has turned away
        (`untried_flips`, whatever the memory model says; in the start-up too), then after the
        start-up a choice never compared, a never-launched one among them
        (`controlled_flips`; one that ran out of memory, never started or that the memory
        model says cannot fit, with another change:
        `tuner.study.pool_trades.pairs_of`)."""
        base = {k: top.params[k] for k in search_space}
        kv_name = self._edge.param.name if self._edge is not None else None
        fresh = fresh_in(trials, self._edge)

        def probe(cand: dict[str, Any], fits: Slack) -> Local | None:
            params, pool = at_pool(cand, top, self._edge, trials)
            return (params, pool) if fresh(params, fits, pool) else None
        permissive = avoiding(dead, _fits_always(trials))
        for cand in untried_flips(base, trials, search_space):
            if self._hidden(cand, base):
                if (found := probe(cand, permissive)) is not None:
                    return found
        if start_up:
            return None
        sign = 1.0 if directions[0] == StudyDirection.MAXIMIZE else -1.0
        if (found := self._repair(top, trials, search_space, slack, sign)) is not None:
            return found
        for cand in controlled_flips(base, trials, search_space, kv_name, sign):
            if (found := probe(cand, slack)) is not None:
                return found
            if fell_over(cand, trials, kv_name) or slack(cand) < 0:
                for pair in pairs_of(cand, top, base, trials, search_space, slack,
                                     self._edge, self._budgets):
                    if (found := probe(pair, permissive)) is not None:
                        return found
        return None

    def _repair(self, top: TrialRecord, trials: Sequence[TrialRecord],
                search_space: dict[str, BaseDistribution], slack: Slack,
                sign: float) -> Local | None:
        """A run that missed the SLOs with a better objective than `top`'s, with a choice
        that won its comparisons (`tuner.study.flips.repairs`), at that run's pool; else one
        that missed a per-token SLO most (`tuner.study.per_token_repairs`): with its
        whole-prompt token budgets at their top, at its share of that config's edge; with a
        faster decode step, at its pool; at one request fewer."""
        best = sign * top.values[0] if top.values else -math.inf
        edge = self._edge
        fresh = fresh_in(trials, edge)
        tops = budget_tops(trials, search_space, edge)
        pinned = itertools.chain(
            repairs(trials, search_space, edge.param.name if edge else None, sign, best),
            ((None, c) for c in topped(trials, search_space, tops, sign, best)),
            faster(trials, search_space, speeds(edge.space) if edge else (), sign, best))
        for miss, cand in pinned:
            params, pool = (cand, None) if miss is None else at_pool(cand, miss, edge, trials)
            if fresh(params, slack, pool):
                return params, pool
        return next(((c, pool) for c, pool in fewer_repairs(trials, search_space, edge, sign,
                                                             best) if fresh(c, slack, pool)), None)

    def _numeric(self, top: TrialRecord, trials: Sequence[TrialRecord],
                 directions: Sequence[Any], search_space: dict[str, BaseDistribution],
                 slack: Slack) -> Local | None:
        """A trade of `top` that ran below its own edge, at that edge, else one that ran out
        of memory, halfway back (`tuner.study.pool_trades.failed_trades`), else a trade that
        missed the SLOs repaired or bisected (`tuner.study.trade_bisection`), else a pool trade
        (`tuner.study.pool_trades`), else an open cap or a cap bisected against the value that
        failed above it, else a raised budget (`tuner.study.open_caps`), else an ascent move
        (`_ascent`), then the pattern move, else a random neighbour that fits."""
        fresh = fresh_in(trials, self._edge)
        for trade in trades_of(top, search_space, self._edge, trials):
            pushed = at_edge(trade, trials, search_space, self._edge)
            if pushed is not None and fresh(pushed, slack):
                return pushed, None
        for failed, half in failed_trades(top, search_space, self._edge, trials):
            if fresh(failed, slack, half):
                return failed, half
        sign = 1.0 if directions[0] == StudyDirection.MAXIMIZE else -1.0
        move = next((c for c in bisected(top, search_space, self._edge, trials, sign)
                     if fresh(c, slack)), None)
        if move is None:
            move = pool_trade(top, search_space, self._edge, trials)
        if move is not None and not fresh(move, slack):
            move = None
        if move is None and self._edge is not None:
            caps = cap_targets(self._edge.space, top.params, self._edge.cells)
            moves = cap_moves(top.params, caps, search_space, trials, self._edge.param.name)
            move = next((c for c in moves if fresh(c, slack)), None)
        if move is None:
            raised = raised_budget(top, trials, search_space, slack, self._edge, self._budgets)
            if raised is not None:
                return raised
            # an ascent is not spent on a turn another move takes
            move = self._ascent(trials, directions, search_space, lambda c: fresh(c, slack))
        pattern = pattern_move(trials, directions, search_space)
        base = {k: top.params[k] for k in search_space}
        inert = inert_knobs(trials, list(search_space))
        cands = itertools.chain((c for c in (move, pattern) if c is not None),
                                (neighbour(base, search_space, self._rng, inert)
                                 for _ in range(TRIES)))
        return next(((c, None) for c in cands if fresh(c, slack)), None)

    def _unmet(self, trials: Sequence[TrialRecord], directions: Sequence[Any],
               search_space: dict[str, BaseDistribution], slack: Slack) -> Local | None:
        """While no run has met the SLOs, where the study has a waiting-time SLO
        (`tuner.study.edge_pushes.waits`): the start-up corner again where it ran out of
        memory, did not start or missed with decode-first on (`design.corner_retry`), else the
        least miss pushed to its edge or traded (`unmet_moves`), else, where a push that could
        not beat the least miss at its edge is left (its last resort), the least miss with a
        faster decode step or its smallest block (`tuner.study.miss_descent.speeds`, `packings`)
        before that push;
        then a descent on the least miss that moves what a step holds
        (`tuner.study.miss_descent`), else an ascent from the run that missed least."""
        fresh = fresh_in(trials, self._edge)
        fast = speeds(self._edge.space) if self._edge is not None else ()
        packs = packings(self._edge.space) if self._edge is not None else {}
        tops = budget_tops(trials, search_space, self._edge)
        if waits(trials):
            edge = self._edge
            retry = design.corner_retry(
                trials, search_space, self._limits,
                (lambda p: deferring(edge.space, edge.cells, p)) if edge else (lambda p: ()))
            if retry is not None and fresh(retry, slack):
                return retry, None
            move, last = unmet_moves(trials, self._edge, search_space)
            if move is not None and fresh(move, slack):
                return move, None
            if last is not None and fresh(last, slack):   # a faster step, a smaller block first
                for cand in descent_moves(trials, search_space, (), fast, packs, tops):
                    if fresh(cand, slack, pinned := held_pool(cand, trials, search_space, edge)):
                        return cand, pinned
                return last, None
        steps = {*self._limits, *self._budgets,
                 *(policies(self._edge.space) if self._edge is not None else ())}
        for cand in descent_moves(trials, search_space, steps, fast, packs, tops):
            if fresh(cand, slack, pinned := held_pool(cand, trials, search_space, self._edge)):
                return cand, pinned
        move = self._ascent(trials, directions, search_space, lambda c: fresh(c, slack))
        return None if move is None else (move, None)

    def _ascent(self, trials: Sequence[TrialRecord], directions: Sequence[Any],
                search_space: dict[str, BaseDistribution],
                runnable: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        """An ascent move (`tuner.study.ascent`) that is `runnable` (fits, not run yet), once
        per run it starts from; None if there is none."""
        found = ascent_move(trials, directions, search_space)
        if found is None or found[0] in self._ascended or not runnable(found[1]):
            return None
        self._ascended.add(found[0])
        return found[1]

    def _incumbent(self, trials: Sequence[TrialRecord], directions: Sequence[Any],
                   search_space: dict[str, BaseDistribution],
                   start_up: bool) -> TrialRecord | None:
        """An incumbent to move from (the first during the start-up, else one at random);
        None without one."""
        tops = incumbents(trials, directions)
        if not tops:
            return None
        tops = distinct(tops, self._edge.param.name if self._edge is not None else None)
        top = tops[0] if start_up else self._rng.choice(tops)
        return top if search_space.keys() <= top.params.keys() else None

    def _hidden(self, cand: dict[str, Any], base: dict[str, Any]) -> bool:
        """Whether the choice `cand` flips in `base` is one the memory filter turned away."""
        return any(p.get(k) == v for k, v in cand.items() if base[k] != v
                   for p in self.turned_away)

    def _draw(self, study: optuna.Study, trial: FrozenTrial,
              search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """One candidate of the wrapped sampler; the start-up design (`tuner.study.design`)
        while it is still in its start-up."""
        params = self._base.sample_relative(study, trial, search_space)
        if params:
            return params
        return self._design.point(search_space,
                                  (t.params for t in study.get_trials(deepcopy=False)))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if "fixed_params" in trial.system_attrs and self._edge is not None:
            if trial.number not in self._open:
                self._open[trial.number] = open_knobs.drawn(
                    study, trial, self._edge,
                    lambda name, dist: self._base.sample_independent(study, trial, name, dist))
            if param_name in self._open[trial.number]:
                return self._open[trial.number][param_name]
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()
        self._rng.seed()


def guided(sampler: BaseSampler, edge: KvEdge | None, startup: int, seed: int | None,
           limits: Collection[str] = (), budgets: Collection[str] = (),
           trials: int | None = None) -> BaseSampler:
    """`sampler` wrapped as the tuner proposes; unchanged for random and grid search, which
    are asked for as such.  Without a KV edge (no card size, or --kv-absolute) the memory
    filter passes everything."""
    if isinstance(sampler, (RandomSampler, optuna.samplers.GridSampler)):
        return sampler
    return GuidedSampler(sampler, edge.slack_of if edge is not None else None, startup, seed,
                         edge=edge, limits=limits, budgets=budgets, trials=trials)

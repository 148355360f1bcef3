"""Numeric local moves: the ascent on ranks and the pool trade."""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection

from tuner.bench.records import Cell
from tuner.search.space import Param, ServerSpec
from tuner.study.ascent import ascent_move
from tuner.study.local_moves import STEP_SCALE
from tuner.study.pool_trades import floor_relief, pool_trade, reliefs
from tuner.study.record import TrialRecord

SPACE = {"cap": IntDistribution(1, 128, log=True), "y": FloatDistribution(0.0, 1.0),
         "budget": IntDistribution(1024, 32768, log=True)}
MAX = [StudyDirection.MAXIMIZE]


def _run(number, params, value, outcome="ok", slo_miss=0.0, kv=None):
    dists = {**SPACE, "kv_share": FloatDistribution(0.0, 1.0), "kv": IntDistribution(0, 10**6)}
    if kv is not None:
        params = {**params, "kv": kv}
    t = optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                  values=[value], user_attrs={"outcome": outcome},
                                  constraints={"slo:p99_ttft_ms": slo_miss})
    t.number = number
    return TrialRecord.of(t)


def test_an_ascent_moves_every_number_the_runs_rank_with_the_objective():
    """cap rises with the value in every run, y does not: only cap moves, from the best run."""
    ys = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2]
    runs = [_run(i, {"cap": 2 ** i, "y": y, "budget": 4096}, float(i)) for i, y in enumerate(ys)]
    source, move = ascent_move(runs, MAX, SPACE)
    assert source == 5
    assert move["cap"] > 32 and move["y"] == 0.2 and move["budget"] == 4096
    # a step of STEP_SCALE of the log range: 32 * 128 ** 0.25 = 108
    assert abs(move["cap"] - 32 * 128 ** STEP_SCALE) <= 1
    assert ascent_move(runs[:4], MAX, SPACE) is None                 # too few runs to rank
    assert ascent_move(runs, MAX * 2, SPACE) is None                 # several objectives


def test_a_run_that_missed_its_slo_ranks_below_every_run_that_met_it():
    """Runs that missed the SLO (by less, the larger the cap) ran faster than those that met it,
    and rank below them all the same: merit is SLOs met first, then misses by how little."""
    missed = [_run(i, {"cap": 1 + i, "y": 0.5, "budget": 4096}, 99.0, outcome="slo",
                   slo_miss=0.9 - 0.4 * i) for i in range(3)]
    met = [_run(3 + i, {"cap": 4 + i, "y": 0.5, "budget": 4096}, 1.0 + i) for i in range(3)]
    source, move = ascent_move(missed + met, MAX, SPACE)
    assert source == 5 and move["cap"] > 6   # from the best run that met it, caps upwards


@dataclass
class _Edge:
    """A KV renderer whose pool grows as `budget` falls (the forward frees memory for it): a
    budget gets the pool of the smallest listed budget at or above it."""

    pools: dict[int, int]
    param: Any = field(default_factory=lambda: type("P", (), {"name": "kv"})())

    useful_pool: int | None = None

    def value(self, params, share, trials):
        listed = [b for b in self.pools if b >= params["budget"]] or [max(self.pools)]
        return int(share * self.pools[min(listed)])

    def within_demand(self, params, value):
        return value if self.useful_pool is None else min(value, self.useful_pool)


def test_a_pool_trade_lowers_the_number_that_frees_the_most_pool_once_per_incumbent():
    space = {**SPACE, "kv_share": FloatDistribution(0.0, 1.0)}
    top = _run(0, {"cap": 8, "y": 0.5, "budget": 16384, "kv_share": 1.0}, 5.0, kv=9000)
    edge = _Edge({16384: 9000, 6889: 13000})   # one step down the log range: 16384 -> 6889
    move = pool_trade(top, space, edge, [top])
    assert move == {**{k: top.params[k] for k in space}, "budget": 6889}
    # the budget's step frees nothing, a budget of 2048 does: the least move that frees
    # memory, by bisection (cap's and y's moves change no pool here)
    move = pool_trade(top, space, _Edge({16384: 9000, 2048: 12000}), [top])
    assert move is not None and 1900 <= move["budget"] <= 2048
    assert {k: v for k, v in move.items() if k != "budget"} == \
        {k: v for k, v in top.params.items() if k in space and k != "budget"}
    # nothing frees memory: no trade
    assert pool_trade(top, space, _Edge({16384: 9000, 1024: 9000}), [top]) is None
    # once a run has tried the incumbent with one number lowered, no second trade
    tried = _run(1, {**move, "cap": 8}, 5.5, kv=13000)
    assert pool_trade(top, space, edge, [top, tried]) is None


def test_a_pool_trade_counts_the_pool_only_up_to_the_workloads_peak_demand():
    """The budget's step would grow the pool 9000 -> 13000 tokens, but 9100 hold every request
    the workload has in flight: no trade."""
    space = {**SPACE, "kv_share": FloatDistribution(0.0, 1.0)}
    top = _run(0, {"cap": 8, "y": 0.5, "budget": 16384, "kv_share": 1.0}, 5.0, kv=9000)
    pools = {16384: 9000, 6889: 13000}
    assert pool_trade(top, space, _Edge(pools, useful_pool=9100), [top]) is None
    move = pool_trade(top, space, _Edge(pools, useful_pool=12000), [top])
    assert move is not None and move["budget"] == 6889


def test_while_no_run_met_its_slo_a_local_turn_climbs_from_the_run_that_missed_least():
    """Six runs after the start-up, none within the SLO; the larger the cap, the smaller the
    miss.  With no incumbent there is nothing to flip or trade, so the local turn is an ascent
    from the run that missed least, its cap moved up a step; only once per run it starts from."""
    from tuner.study.proposals import GuidedSampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler = GuidedSampler(optuna.samplers.TPESampler(seed=0, n_startup_trials=2), None, 2,
                            seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    ys = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2]
    for i, y in enumerate(ys):
        run = _run(i, {"cap": 2 ** i, "y": y, "budget": 4096}, 1.0, outcome="slo",
                   slo_miss=1.0 - 0.1 * i)
        study.add_trial(optuna.trial.create_trial(
            params=run.params, distributions={k: SPACE[k] for k in run.params}, values=[1.0],
            user_attrs={"outcome": "slo"}, constraints={"slo:p99_ttft_ms": 1.0 - 0.1 * i}))
    first = study.ask({k: SPACE[k] for k in SPACE})   # trial 6: a local turn
    assert first.params["y"] == 0.2 and first.params["budget"] == 4096
    assert abs(first.params["cap"] - 32 * 128 ** STEP_SCALE) <= 1
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    study.ask({k: SPACE[k] for k in SPACE})           # trial 7: a draw
    again = study.ask({k: SPACE[k] for k in SPACE})   # trial 8: no second ascent from run 5
    assert again.params != first.params


def test_a_relief_lowers_one_number_to_the_largest_value_the_memory_model_fits():
    """A flip that ran out of memory; need = budget + 100 x cap.  At the incumbent's pool the
    card leaves 12000: the budget falls to the largest value within it.  No cap gets there
    (cap 1 still needs 16484), so cap falls to what fits at all (16500); y frees nothing."""
    flip = {"cap": 8, "y": 0.5, "budget": 16384}
    need = lambda c: c["budget"] + 100 * c["cap"]  # noqa: E731
    at_pool = lambda c: need(c) <= 12000           # noqa: E731
    anywhere = lambda c: need(c) <= 16500          # noqa: E731
    by_budget, by_cap = reliefs(flip, SPACE, [at_pool, anywhere])   # the smaller move first
    assert by_budget["cap"] == 8 and by_budget["y"] == 0.5
    assert at_pool(by_budget) and by_budget["budget"] >= 0.99 * (12000 - 800)   # a bisection
    assert by_cap == {**flip, "cap": 1}
    assert reliefs({**flip, "budget": 8192}, SPACE, [at_pool]) == []   # it fits already
    assert reliefs(flip, SPACE, [lambda c: need(c) <= 1000]) == []     # nothing fits


def test_a_floor_relief_needs_a_choice_that_never_ran_healthy_and_a_number_not_yet_at_floor():
    """The flipped choice (g) ran only out of memory, once with cap at its floor: the floor
    relief is the roomiest other number's (need grows with budget and y); a healthy run of the
    choice, whatever its numbers, ends it."""
    space = {**SPACE, "g": CategoricalDistribution([False, True])}
    dists = {**space, "kv_share": FloatDistribution(0.0, 1.0)}

    def run(params, outcome):
        return TrialRecord.of(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params}, values=[1.0],
            user_attrs={"outcome": outcome}))
    base = {"cap": 8, "y": 0.5, "budget": 16384, "g": False}
    flip = {**base, "g": True}
    oom = [run({**flip, "cap": 1}, "oom")]
    room = lambda c: -c["budget"] - 1000 * c["y"]  # noqa: E731
    assert floor_relief(flip, base, space, oom, room) == [{**flip, "budget": 1024}]
    assert floor_relief(flip, base, space, [*oom, run({**flip, "y": 0.9}, "slo")], room) == []


def test_a_floor_relief_the_model_cannot_rank_lowers_a_token_budget_first():
    """Every floor leaves the same room: the token budget's goes first, not the first by name;
    `SearchSpace.budgets` names the knobs whose role is a step's token budget."""
    from pathlib import Path

    from tuner.search.space_file import load_space

    space = {**SPACE, "g": CategoricalDistribution([False, True])}
    base = {"cap": 8, "y": 0.5, "budget": 16384, "g": False}
    flip = {**base, "g": True}
    tie = lambda c: -1.0  # noqa: E731
    assert floor_relief(flip, base, space, [], tie) == [{**flip, "cap": 1}]
    assert floor_relief(flip, base, space, [], tie, {"budget"}) == [{**flip, "budget": 1024}]
    root = Path(__file__).resolve().parents[2]
    assert load_space(root / "search_spaces" / "infinilm.yaml").budgets() == [
        "max_num_batched_tokens"]


@dataclass
class _StudyEdge(_Edge):
    """`_Edge` as the proposals read it: the edge of a config is its whole pool, and the
    workload's busiest cell holds `busiest` requests of the `cap` knob's kind."""

    busiest: int = 1
    pinned: dict[int, int] = field(default_factory=dict)

    @property
    def space(self):
        return SimpleNamespace(parameters=[Param("cap", "int", role="decode_batch_cap")],
                               server=ServerSpec(command=("server",)))

    @property
    def cells(self):
        return (Cell(self.busiest, 16, 16),)

    def edge(self, params, trials):
        return self.pools[params["budget"]]

    def share_of(self, params, target, trials):
        return target / self.pools[params["budget"]]

    def carried(self, value, source, target):
        return value

    def modelled(self, params, trials):
        return self.edge(params, trials)

    def forward(self, params, value, trials):
        return 0.0   # no forward: a flip that moves the edge frees memory outside it


def _ask_local(edge: _StudyEdge, runs: list[tuple[dict[str, Any], int, float]],
               trials: int | None = None, more: dict[str, Any] | None = None) -> dict[str, Any]:
    """The proposal of the first local turn after `runs` (params, pool, value) are told."""
    from tuner.study.proposals import GuidedSampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = {**SPACE, **(more or {}), "kv_share": FloatDistribution(0.0, 1.0)}
    base = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=100)
    sampler = GuidedSampler(base, None, 1, seed=0, edge=edge, trials=trials)  # type: ignore[arg-type]
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for params, pool, value in runs:
        study.add_trial(optuna.trial.create_trial(
            params={**params, "kv": pool}, values=[value], user_attrs={"outcome": "ok"},
            distributions={**space, "kv": IntDistribution(pool, pool)}))
    while True:
        asked = study.ask(space)
        if asked.number % 2 == 0 or (trials is not None and asked.number >= trials - trials // 3):
            return asked.params
        study.tell(asked, state=optuna.trial.TrialState.FAIL)


def test_a_trade_that_ran_below_its_own_edge_is_run_again_at_that_edge():
    """The trade lowered the budget for a pool the model put at 10000 tokens; its own run
    showed the model that 13000 fit.  A pool short of what the config can hold says nothing
    about the trade (on a fresh Mistral-7B / RTX 4090 scenario a trade run 3% under the pool
    that admits the chat cell's 35th request measured nothing, and one seed stayed at 0.86 of
    the best for 20 trials): it is run again at its edge, before any other move."""
    top = {"cap": 64, "y": 0.5, "budget": 16384, "kv_share": 1.0}
    trade = {**top, "budget": 6889, "kv_share": 10000 / 13000}
    edge = _StudyEdge({16384: 9000, 6889: 13000})
    assert _ask_local(edge, [(top, 9000, 5.0), (trade, 10000, 4.9)]) == {**trade, "kv_share": 1.0}
    # at its edge already: the next move (here, the open cap) instead
    edge = _StudyEdge({16384: 9000, 6889: 10000}, busiest=96)
    assert _ask_local(edge, [(top, 9000, 5.0), (trade, 10000, 4.9)])["cap"] == 96


def test_in_the_last_third_every_second_local_turn_moves_a_number_before_any_flip():
    """A flip of the block size waits for a cap the busiest cell runs into: in the last third
    local turns alternate, a number first at odd trials."""
    flip = {"c": CategoricalDistribution([16, 256])}
    top = {"cap": 8, "y": 0.5, "budget": 16384, "kv_share": 1.0, "c": 16}
    edge = _StudyEdge({16384: 9000}, busiest=48)
    runs = [(top, 9000, 5.0), ({**top, "y": 0.4}, 9000, 4.0), ({**top, "y": 0.3}, 9000, 3.0)]
    assert _ask_local(edge, runs, more=flip)["c"] == 256                 # a flip first
    asked = _ask_local(edge, runs, trials=4, more=flip)                  # trial 3: last third
    assert asked["cap"] == 48 and asked["c"] == 16

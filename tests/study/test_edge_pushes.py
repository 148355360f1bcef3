"""Runs that missed a waiting-time SLO at a small pool, pushed once to their own edge."""

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.study import StudyDirection

from tuner.study.edge_pushes import outgrown, promising, unmet_moves, waits
from tuner.study.record import KV_SHARE, TrialRecord

SPACE = {"cap": IntDistribution(1, 128), KV_SHARE: FloatDistribution(0.0, 1.0)}
MAX = [StudyDirection.MAXIMIZE]


def unmet_move(trials: Any, edge: Any, space: Any) -> dict[str, Any] | None:
    """What the proposals run of `unmet_moves`: the move, else its last resort."""
    move, last = unmet_moves(trials, edge, space)
    return move if move is not None else last


@dataclass
class _Edge:
    """Every config's edge is 40k tokens; the pool that holds the workload is `demand`."""

    demand: int = 10 ** 6

    param: Any = field(default_factory=lambda: SimpleNamespace(name="kv"))

    def edge(self, params: dict[str, Any], trials: Any) -> int:
        return 40_000

    def within_demand(self, params: dict[str, Any], value: int) -> int:
        return min(value, self.demand)


def _run(number: int, cap: int, kv: int, value: float, outcome: str = "ok",
         **misses: float) -> TrialRecord:
    t = optuna.trial.create_trial(
        params={"cap": cap, KV_SHARE: 0.5, "kv": kv},
        distributions={**SPACE, "kv": IntDistribution(0, 10 ** 6)}, values=[value],
        user_attrs={"outcome": outcome},
        constraints={"slo:p99_ttft_ms": 0.0, **{f"slo:{k}": v for k, v in misses.items()}})
    t.number = number
    return TrialRecord.of(t)


def test_a_ttft_miss_at_a_small_pool_is_pushed_when_its_edge_could_beat_the_incumbent():
    """242 tok/s at 7.2k tokens of a 40k edge could be 1340 there: above the incumbent's 610.
    A run whose miss a larger pool cannot cure (TPOT), or whose bound is under the incumbent,
    or whose config already ran twice, is not pushed."""
    top = _run(0, 21, 35_000, 610.0)
    corner = _run(1, 128, 7_200, 242.0, "slo", p99_ttft_ms=1.22)
    tpot = _run(2, 64, 7_200, 300.0, "slo", p99_tpot_ms=0.1)
    slow = _run(3, 8, 20_000, 200.0, "slo", p99_ttft_ms=0.5)          # 400 at 40k: < 610
    edge: Any = _Edge()
    trials = [top, corner, tpot, slow]
    assert promising(top, trials, edge, SPACE, MAX) == [corner]
    again = _run(4, 128, 9_000, 250.0, "slo", p99_ttft_ms=1.0)          # pushed once already
    assert promising(top, [*trials, again], edge, SPACE, MAX) == []
    # the larger pool must be larger by the miss: 2.2x 7.2k is within 40k, not within 12k
    assert promising(top, trials, _Edge(demand=12_000), SPACE, MAX) == []
    assert promising(top, trials, None, SPACE, MAX) == []
    assert promising(top, trials, edge, SPACE, [StudyDirection.MINIMIZE]) == []


def test_runs_that_met_their_slos_are_left_to_the_incumbents_own_moves():
    top = _run(0, 21, 35_000, 610.0)
    small = _run(1, 128, 7_200, 500.0)
    assert promising(top, [top, small], _Edge(), SPACE, MAX) == []


@dataclass
class _BudgetEdge(_Edge):
    """The edge shrinks by two tokens of pool per token of prefill budget above 4096 (below,
    the forward's other buffers set its size): 51.8k tokens at 4096 and under."""

    def edge(self, params: dict[str, Any], trials: Any) -> int:
        return 60_000 - 2 * max(4096, int(params["budget"]))

    def useful(self, params: dict[str, Any]) -> int | None:
        return None if self.demand >= 10 ** 6 else self.demand

    def share_of(self, params: dict[str, Any], value: int, trials: Any) -> float:
        return value / self.edge(params, trials)


BUDGET_SPACE = {**SPACE, "budget": IntDistribution(1024, 32768, log=True)}


def _unmet(number: int, budget: int, kv: int, cap: int = 128, **misses: float) -> TrialRecord:
    t = optuna.trial.create_trial(
        params={"cap": cap, "budget": budget, KV_SHARE: 0.7, "kv": kv},
        distributions={**BUDGET_SPACE, "kv": IntDistribution(0, 10 ** 6)}, values=[240.0],
        user_attrs={"outcome": "slo"}, constraints={f"slo:{k}": v for k, v in misses.items()})
    t.number = number
    return TrialRecord.of(t)


def test_while_nothing_met_the_slos_the_least_waiting_miss_lowers_its_budget_to_its_knee():
    """8k tokens that missed p99 TTFT by 97% ask for a pool of 15.8k, which a budget of 22.1k
    would hold: the budget that must move least.  It comes down further, to its knee: the
    largest budget whose edge is within 2% (`EDGE_TOL`) of the edge at the bottom of its range
    (51.8k): 4.6k, at that edge; the cap, which frees no memory, stays.  The worse miss (3.3x
    at 30k of a 51.8k edge) is not pushed first: at 1 / pool it would still miss by 1.5x.
    Once per run (then the worse miss is pushed, whatever it would miss, as the last resort:
    the proposals try a faster decode step of the least miss first); never for a TPOT
    miss, nor where the pool already holds the workload's peak demand."""
    corner = _unmet(0, 26_000, 8_000, p99_ttft_ms=0.97)
    worse = _unmet(1, 2_000, 30_000, cap=4, p99_ttft_ms=3.3)
    edge: Any = _BudgetEdge()
    trade = unmet_move([corner, worse], edge, BUDGET_SPACE)
    assert trade is not None
    assert trade["cap"] == 128 and trade[KV_SHARE] == 1.0
    assert 4_096 < trade["budget"] <= 4_614    # 60k - 2 x budget >= 0.98 x 51.8k
    ran = _unmet(2, trade["budget"], 50_000, p99_ttft_ms=1.5)   # the trade ran, and missed
    assert unmet_move([corner, worse, ran], edge, BUDGET_SPACE) == {   # once per run
        "cap": 4, "budget": 2_000, KV_SHARE: 1.0}
    assert unmet_moves([corner, worse, ran], edge, BUDGET_SPACE)[0] is None   # a last resort
    tpot = _unmet(0, 26_000, 8_000, p99_tpot_ms=0.2)
    assert unmet_move([tpot], edge, BUDGET_SPACE) is None
    assert unmet_move([corner], _BudgetEdge(demand=8_100), BUDGET_SPACE) is None
    assert unmet_move([corner], None, BUDGET_SPACE) is None


def test_a_trade_stops_at_the_pool_that_holds_the_workloads_peak_demand():
    """With a peak demand of 20k tokens the knee is the budget whose edge holds 20k: 20k, not
    lower (a smaller budget would hold a pool no request of the workload uses)."""
    corner = _unmet(0, 26_000, 8_000, p99_ttft_ms=0.97)
    trade = unmet_move([corner], _BudgetEdge(demand=20_000), BUDGET_SPACE)
    assert trade is not None and 19_000 < trade["budget"] <= 20_000


def test_a_miss_under_the_edge_tolerance_is_traded_too():
    """A 1% TTFT miss asks for a pool 2% (`EDGE_TOL`) larger; the budget comes down to its
    knee as for any miss.  Only a pool that already holds the peak demand is left alone."""
    near = _unmet(0, 26_000, 8_000, p99_ttft_ms=0.01)
    edge: Any = _BudgetEdge()
    trade = unmet_move([near], edge, BUDGET_SPACE)
    assert trade is not None and trade[KV_SHARE] == 1.0
    assert 4_096 < trade["budget"] <= 4_614
    assert unmet_move([near], _BudgetEdge(demand=8_100), BUDGET_SPACE) is None


@dataclass
class _CorrectedEdge(_BudgetEdge):
    """`_BudgetEdge`, 10k tokens lower once a run has run out of memory (its OOM corrected
    the model)."""

    def edge(self, params: dict[str, Any], trials: Any) -> int:
        oom = any(t.outcome == "oom" for t in trials)
        return super().edge(params, trials) - (10_000 if oom else 0)


def test_a_trade_that_ran_out_of_memory_is_traded_again_at_the_corrected_edge_once():
    """The trade's OOM says nothing of the SLO: the model it corrected asks for a lower budget
    for the same pool.  A trade that ran (met or missed) or two that ran out of memory end
    the run's trades."""
    corner = _unmet(0, 26_000, 8_000, p99_ttft_ms=0.97)
    edge: Any = _CorrectedEdge()
    first = unmet_move([corner], edge, BUDGET_SPACE)
    assert first is not None and 4_096 < first["budget"] <= 4_614
    oom = _unmet(1, first["budget"], 50_000)
    oom = dataclasses.replace(oom, outcome="oom", constraints={})
    again = unmet_move([corner, oom], edge, BUDGET_SPACE)
    assert again is not None and 4_096 < again["budget"] <= 4_614   # at the corrected edge
    ran = _unmet(2, again["budget"], 16_000, p99_tpot_ms=0.5)     # ran: no more trades
    assert unmet_move([corner, oom, ran], edge, BUDGET_SPACE) is None
    twice = dataclasses.replace(ran, outcome="oom", constraints={})
    assert unmet_move([corner, oom, twice], edge, BUDGET_SPACE) is None


@dataclass
class _SharedEdge(_BudgetEdge):
    """`_BudgetEdge` with the share a pool is of its edge."""

    def share_of(self, params: dict[str, Any], value: int, trials: Any) -> float:
        return value / self.edge(params, trials)


def test_while_nothing_met_the_slos_a_miss_its_pool_could_cure_is_pushed_first():
    """Round 39 (Qwen2.5-7B / RTX 3090, open loop): p99 TTFT 43.6 s at a 10k pool, 8.6 s at
    41k, so a miss of 3.3x is no bar to a push.  The corner that missed least already sits at
    its edge (8k of 8k); the next miss, 3.3x at 5k of a 51.8k edge, would meet the SLO at
    1 / pool (4.3 x 5k / 51.8k < 1): it is pushed there before the corner is traded.  Not a config
    that ran twice, not a TPOT miss, not without an edge."""
    corner = _unmet(0, 26_000, 8_000, p99_ttft_ms=0.97)
    worse = _unmet(1, 2_000, 5_000, cap=4, p99_ttft_ms=3.3)
    edge: Any = _SharedEdge()
    push = unmet_move([corner, worse], edge, BUDGET_SPACE)
    assert push == {"cap": 4, "budget": 2_000, KV_SHARE: 1.0}
    again = _unmet(2, 2_000, 51_800, cap=4, p99_ttft_ms=0.2)   # the push ran: twice now
    assert unmet_move([corner, worse, again], edge, BUDGET_SPACE)["cap"] == 128   # a trade
    tpot = _unmet(1, 2_000, 5_000, cap=4, p99_tpot_ms=3.3)
    assert unmet_move([corner, tpot], edge, BUDGET_SPACE)["cap"] == 128
    assert unmet_move([corner, worse], None, BUDGET_SPACE) is None


def test_a_miss_below_its_own_edge_is_no_bar_to_another_push():
    """Round 45 (h-qwen7b-4090-rag seed 9): the least miss (23% at 19.2k tokens of a 51.8k
    edge) was pushed and ran out of memory; the start-up corner missed by 74% at 12.9k of its
    14k edge.  The least miss is not at its edge, so it bars no push: the corner, the next
    least miss, is pushed, not the server's default (a 123% miss at 10k) that promises more at
    1 / pool.  Measured against the 23%, the corner (60% at 1 / pool) was passed over."""
    least = _unmet(0, 2_000, 19_200, cap=64, p99_ttft_ms=0.23)
    pushed = dataclasses.replace(_unmet(1, 2_000, 21_500, cap=64), outcome="oom", constraints={})
    corner = _unmet(2, 23_000, 12_900, p99_ttft_ms=0.74)
    default = _unmet(3, 2_000, 10_000, cap=8, p99_ttft_ms=1.23)
    move = unmet_move([least, pushed, corner, default], _SharedEdge(), BUDGET_SPACE)
    assert move == {"cap": 128, "budget": 23_000, KV_SHARE: 1.0}


def test_a_trade_asks_for_the_most_one_number_frees_where_the_miss_asks_for_more():
    """Round 45 (q-qwen7b-3090-open seed 6): the corner at its edge missed by 2.1x at 14.6k
    tokens and asked for a 45k pool, more than any budget frees (41k at the bottom of its
    range); it was never traded.  Here 8k tokens missed by 9x: a 80k pool, where the budget
    at the bottom frees 51.8k: traded to the budget's knee all the same."""
    corner = _unmet(0, 26_000, 8_000, p99_ttft_ms=9.0)
    trade = unmet_move([corner], _BudgetEdge(), BUDGET_SPACE)
    assert trade is not None and trade[KV_SHARE] == 1.0
    assert 4_096 < trade["budget"] <= 4_614


def test_a_study_waits_for_blocks_only_under_a_ttft_or_end_to_end_slo():
    assert waits([_unmet(0, 26_000, 8_000, p99_ttft_ms=0.97)])
    assert waits([_unmet(0, 26_000, 8_000, p99_e2el_ms=-0.2)])
    assert not waits([_unmet(0, 26_000, 8_000, p99_tpot_ms=0.2)])


def test_a_run_is_not_pushed_past_a_larger_pool_of_its_knobs_that_missed_the_slos():
    """j-8b seed 1 (round 27): 744.7 tok/s at 35.2k tokens met the TTFT SLO, the same knobs at
    41.5k missed it, and the pushes went on up to the memory edge (44.7k, 46.2k, 45.5k) for
    the last launches of a 10-trial study.  A larger pool that missed the SLOs stops the
    pushes; one that met them, even slower (throughput steps with the pool), an OOM (the
    memory edge's own bisection), other knobs and smaller pools do not, nor does anything
    stop a run that missed the SLOs itself."""
    top = _run(0, 128, 35_200, 744.7)
    assert not outgrown(top, [top], "kv")
    missed = _run(1, 128, 41_500, 760.0, "slo", p99_ttft_ms=0.2)
    assert outgrown(top, [top, missed], "kv")
    slower, oom = _run(2, 128, 41_500, 700.0), _run(3, 128, 47_800, 0.0, "oom")
    others = [_run(4, 64, 41_500, 700.0, "slo", p99_ttft_ms=0.2),
              _run(5, 128, 30_000, 700.0, "slo", p99_ttft_ms=0.2)]
    assert not outgrown(top, [top, slower, oom, *others], "kv")
    small = _run(6, 128, 20_000, 300.0, "slo", p99_ttft_ms=0.5)
    assert not outgrown(small, [small, missed], "kv")

"""A pool trade that missed the SLOs with a better objective: its caps opened, the traded number
bisected; a trade that ran out of memory, run again halfway back."""

from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution

from tuner.study import trade_bisection
from tuner.study.pool_trades import failed_trades
from tuner.study.record import TrialRecord
from tuner.study.trade_bisection import bisected

SPACE = {"cap": IntDistribution(1, 128), "budget": IntDistribution(1024, 32768, log=True),
         "kv_share": FloatDistribution(0.0, 1.0)}


def _run(number: int, budget: int, kv: int, value: float, outcome: str = "ok",
         cap: int = 8) -> TrialRecord:
    params = {"cap": cap, "budget": budget, "kv_share": 1.0, "kv": kv}
    dists = {**SPACE, "kv": IntDistribution(0, 10**6)}
    missed = {"ok": -0.1, "slo": 0.3, "oom": 1.0}[outcome]
    t = optuna.trial.create_trial(params=params, distributions=dists, values=[value],
                                  user_attrs={"outcome": outcome},
                                  constraints={"slo:p99_tpot_ms": missed})
    t.number = number
    return TrialRecord.of(t)


@dataclass
class _Edge:
    """A KV renderer whose pool grows as the budget falls below 6000 tokens, and not above."""

    param: Any = field(default_factory=lambda: type("P", (), {"name": "kv"})())
    space: Any = None
    cells: tuple = ()

    def value(self, params, share, trials):
        return int(share * (9000 if params["budget"] >= 6000 else 15000 - params["budget"]))


@pytest.fixture(autouse=True)
def _no_binding_caps(monkeypatch):
    monkeypatch.setattr(trade_bisection, "cap_targets", lambda space, params, cells: {})


def test_a_trade_that_missed_the_slo_with_more_throughput_is_bisected_where_the_pool_grows():
    """The incumbent (16k budget, 9000 tokens) met the SLO; its trade to 2048 ran faster and
    missed.  The middle of the bracket on the budget's log scale is 5793, which the model says
    holds more pool: that is the move, the other knobs as the incumbent's."""
    top = _run(0, 16384, 9000, 100.0)
    trade = _run(1, 2048, 12952, 150.0, outcome="slo")
    moves = bisected(top, SPACE, _Edge(), [top, trade], 1.0)
    assert moves == [{"cap": 8, "budget": 5793, "kv_share": 1.0}]
    # a middle that meets the SLOs is the new incumbent and narrows the bracket from above
    mid = _run(2, 5793, 9207, 140.0)
    assert bisected(mid, SPACE, _Edge(), [top, trade, mid], 1.0) == [
        {"cap": 8, "budget": 3444, "kv_share": 1.0}]
    # a trade no better than the incumbent, or without a miss below the lowest value that
    # met, bisects nothing
    assert bisected(top, SPACE, _Edge(), [top, _run(1, 2048, 12952, 90.0, "slo")], 1.0) == []
    assert bisected(_run(0, 1500, 9000, 100.0), SPACE, _Edge(), [trade], 1.0) == []


def test_a_middle_the_model_gives_no_more_pool_is_passed_over_for_the_lower_half():
    """Between 32768 and 2048 the log middle is 8192, where the model holds the incumbent's
    pool: that is the incumbent's run again, so the lower half's middle (4096) is the move.
    Where no middle down to the narrowest bracket frees memory, there is none: the search
    ends on the budget's integer grid."""
    top = _run(0, 32768, 9000, 100.0)
    moves = bisected(top, SPACE, _Edge(), [top, _run(1, 2048, 12952, 150.0, "slo")], 1.0)
    assert moves == [{"cap": 8, "budget": 4096, "kv_share": 1.0}]
    assert bisected(top, SPACE, _Edge(), [top, _run(1, 5990, 9010, 150.0, "slo")], 1.0) == []


def test_a_cap_that_binds_at_the_missed_trades_pool_is_opened_first(monkeypatch):
    """The trade's pool admits more requests than its cap of 8 holds: the trade with the cap
    opened comes before the bisection, at the trade's own share."""
    monkeypatch.setattr(trade_bisection, "cap_targets", lambda space, params, cells: {"cap": 48})
    top = _run(0, 16384, 9000, 100.0)
    trade = _run(1, 2048, 12952, 150.0, outcome="slo")
    moves = bisected(top, SPACE, _Edge(), [top, trade], 1.0)
    assert moves[0] == {"cap": 48, "budget": 2048, "kv_share": 1.0}
    assert moves[1]["budget"] == 5793 and moves[1]["cap"] == 8


def test_a_trade_that_ran_out_of_memory_runs_again_halfway_back_to_the_incumbents_pool():
    """Lowering a number never needs more memory, so the trade fits at the incumbent's 8000
    tokens; it died at 12800: it runs again at 10400, once."""
    top = _run(0, 32768, 8000, 100.0)
    died = _run(1, 6000, 12800, 0.0, outcome="oom")
    rest = {"cap": 8, "budget": 6000, "kv_share": 1.0}
    assert failed_trades(top, SPACE, _Edge(), [top, died]) == [(rest, 10400)]
    again = _run(2, 6000, 10400, 0.0, outcome="oom")
    assert failed_trades(top, SPACE, _Edge(), [top, died, again]) == []
    assert failed_trades(top, SPACE, None, [top, died]) == []


def test_a_bracket_on_a_short_integer_range_ends_where_its_middles_round_onto_a_value_passed():
    """A long-context cap of 1-8 traded 4 -> 2: the middle 3 frees nothing by the model, and
    the next middle (2.5) rounds back onto 3.  Nothing more is proposed, and the search ends
    (it once looped there for good)."""
    space = {**SPACE, "cap": IntDistribution(1, 8)}
    top = _run(0, 16384, 9000, 100.0, cap=4)
    trade = _run(1, 16384, 9500, 150.0, outcome="slo", cap=2)
    assert bisected(top, space, _Edge(), [top, trade], 1.0) == []

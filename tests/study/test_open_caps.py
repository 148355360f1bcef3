"""The open-caps move: a request cap below the busiest cell's concurrency, raised to it."""

from types import SimpleNamespace

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.space import Param
from tuner.study.open_caps import (
    in_flight,
    opened_caps,
    raised_budgets,
    request_caps,
    untested,
)
from tuner.study.record import KV_SHARE, TrialRecord

CAPS = ["batch", "decode", "stepped"]

DISTS = {"batch": IntDistribution(1, 128, log=True), "decode": IntDistribution(1, 128),
         "stepped": IntDistribution(8, 256, step=8), "budget": IntDistribution(1024, 32768, log=True),
         "graph": CategoricalDistribution([False, True])}
CELLS = [Cell(48, 384, 256, 96), Cell(8, 3072, 512, 16), Cell(64, 128, 128, 32)]


def test_the_request_caps_are_the_batch_caps_not_the_budgets_or_long_context_guards():
    roles = {"batch": "max_batch", "pc": "prefill_batch_cap", "dc": "decode_batch_cap",
             "budget": "prefill_token_budget", "long": "long_max_batch", "kv": "kv_tokens"}
    space = SimpleNamespace(parameters=[Param(n, "int", role=r) for n, r in roles.items()])
    assert request_caps(space) == ["batch", "pc", "dc"]  # type: ignore[arg-type]


def test_in_flight_is_the_most_requests_one_cell_holds():
    """64 requests at once, but only 32 in the cell: 48 is the most any cell holds."""
    assert in_flight(CELLS) == 48
    assert in_flight([]) == 0


def test_each_binding_cap_is_raised_to_the_busiest_cells_concurrency_most_binding_first():
    top = {"batch": 40, "decode": 19, "stepped": 64, "budget": 2048, "graph": True, "kv": 9}
    moves = opened_caps(top, CAPS, DISTS, CELLS)
    assert moves == [{**{k: top[k] for k in DISTS}, "decode": 48},
                     {**{k: top[k] for k in DISTS}, "batch": 48}]
    # a cap already at or above the concurrency, and the token budget, are never moved
    assert opened_caps({**top, "batch": 48, "decode": 100}, CAPS, DISTS, CELLS) == []


def test_a_cap_lands_on_its_grid_and_never_past_its_range():
    top = {"batch": 100, "decode": 100, "stepped": 16, "budget": 2048, "graph": False}
    (move,) = opened_caps(top, CAPS, DISTS, [Cell(50, 10, 10)])
    assert move["stepped"] == 56                      # 50 rounded up onto the step of 8
    (move,) = opened_caps({**top, "batch": 128, "stepped": 256, "decode": 60}, CAPS,
                          {**DISTS, "decode": IntDistribution(1, 64)}, [Cell(500, 10, 10)])
    assert move["decode"] == 64                       # the top of its range


def test_a_budget_is_raised_towards_the_busiest_cells_prompts_as_far_as_the_pool_fits():
    """The busiest cell has 32 x 1000 prompt tokens in flight (the 48-request chat cell
    18432): a budget of 2048 is raised to 32000 where that fits, else to the largest value
    that does (here, with 10000 the most the pool leaves room for), and never lowered."""
    dists = {"budget": IntDistribution(1024, 32768, log=True), "cap": IntDistribution(1, 128)}
    cells = [Cell(48, 384, 256, 96), Cell(32, 1000, 300, 64)]
    top = {"budget": 2048, "cap": 8}
    (move,) = raised_budgets(top, ["budget"], dists, cells, lambda c: True)
    assert move == {"budget": 32000, "cap": 8}
    (move,) = raised_budgets(top, ["budget"], dists, cells, lambda c: c["budget"] <= 10000)
    assert 9900 <= move["budget"] <= 10000
    assert raised_budgets(top, ["budget"], dists, cells, lambda c: c["budget"] <= 2048) == []
    assert raised_budgets({**top, "budget": 32768}, ["budget"], dists, cells,
                          lambda c: True) == []
    # a raise of less than EDGE_TOL measures the same run again
    assert raised_budgets(top, ["budget"], dists, cells, lambda c: c["budget"] <= 2080) == []


def _ran(params, outcome):
    return TrialRecord.of(optuna.trial.create_trial(
        params=params, distributions={k: IntDistribution(0, 10 ** 6) for k in params},
        values=[1.0], user_attrs={"outcome": outcome}))


def test_an_open_cap_whose_config_ran_healthy_at_any_pool_is_not_proposed_again():
    """The pool aside: a raise run healthy at 9327 tokens is not a new move at 9847; one that
    only ran out of memory is (at a lower pool, where the model's edge moved)."""
    raised = {"batch": 48, "budget": 2048}
    cands = [{**raised, KV_SHARE: 0.7}, {"batch": 40, "budget": 4096, KV_SHARE: 0.7}]
    assert untested(cands, [_ran({**raised, "kv": 10367}, "oom")], "kv") == cands
    assert untested(cands, [_ran({**raised, "kv": 9327}, "ok")], "kv") == cands[1:]
    assert untested(cands, [_ran({**raised, "kv": 9327}, "slo")], "kv") == cands[1:]

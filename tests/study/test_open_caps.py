"""The open-caps move: a request cap below the busiest cell's concurrency, raised to it."""

from types import SimpleNamespace

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tests.study.test_flips import CHAT, KNOBS, _edge
from tests.study.test_flips import _ran as _healthy_at
from tuner.bench.records import Cell
from tuner.search.space import Param
from tuner.study.open_caps import (
    bisected_caps,
    cap_moves,
    cap_targets,
    in_flight,
    opened_caps,
    raised_budget,
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
    caps = {name: in_flight(CELLS) for name in CAPS}
    moves = opened_caps(top, caps, DISTS)
    assert moves == [{**{k: top[k] for k in DISTS}, "decode": 48},
                     {**{k: top[k] for k in DISTS}, "batch": 48}]
    # a cap already at or above the concurrency, and the token budget, are never moved
    assert opened_caps({**top, "batch": 48, "decode": 100}, caps, DISTS) == []


def test_a_cap_lands_on_its_grid_and_never_past_its_range():
    top = {"batch": 100, "decode": 100, "stepped": 16, "budget": 2048, "graph": False}
    (move,) = opened_caps(top, dict.fromkeys(CAPS, 50), DISTS)
    assert move["stepped"] == 56                      # 50 rounded up onto the step of 8
    (move,) = opened_caps({**top, "batch": 128, "stepped": 256, "decode": 60},
                          dict.fromkeys(CAPS, 500), {**DISTS, "decode": IntDistribution(1, 64)})
    assert move["decode"] == 64                       # the top of its range



def test_the_long_context_guard_holds_the_long_requests_its_own_threshold_counts():
    """The guard's cap is opened to the long requests a cell keeps in flight: 12 prompts of
    12k tokens (of 24) beside 96 chat requests of 768; the batch caps to the 96.  Which
    requests are long is the config's own call: at a threshold over every prompt, none is, and
    the guard is not a cap to open; by prompt + output, a 3.9k prompt with 200 output tokens is
    long at 4096."""
    roles = {"batch": "max_batch", "dc": "decode_batch_cap", "long": "long_max_batch",
             "thr": "long_threshold", "total": "long_use_total_len"}
    space = SimpleNamespace(parameters=[Param(n, "int", role=r) for n, r in roles.items()])
    cells = [Cell(96, 768, 384, 192), Cell(12, 12000, 200, 24)]
    top = {"batch": 64, "dc": 64, "long": 3, "thr": 2048, "total": False}
    targets = cap_targets(space, top, cells)  # type: ignore[arg-type]
    assert targets == {"batch": 96, "dc": 96, "long": 12}
    dists = {"batch": IntDistribution(1, 128), "dc": IntDistribution(1, 128),
             "long": IntDistribution(1, 8)}
    assert opened_caps(top, targets, dists)[0] == {"batch": 64, "dc": 64, "long": 8}
    assert "long" not in cap_targets(space, {**top, "thr": 16384}, cells)  # type: ignore[arg-type]
    edge = [Cell(4, 3900, 200, 8)]
    assert "long" not in cap_targets(space, {**top, "thr": 4096}, edge)  # type: ignore[arg-type]
    assert cap_targets(space, {**top, "thr": 4096, "total": True},  # type: ignore[arg-type]
                       edge)["long"] == 4

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


def test_a_cap_whose_raise_failed_is_bisected_between_the_incumbent_and_the_failure():
    """Round 31 (Mistral-7B / A100 80 GB): long prompts per step 5 ran, 8 missed the median
    TTFT SLO, and 6 and 7 were never tried."""
    dists = {"long": IntDistribution(1, 8), "batch": IntDistribution(1, 128, log=True),
             "graph": CategoricalDistribution([False, True])}
    top = {"long": 5, "batch": 128, "graph": True, "kv": 9000}
    base = {k: top[k] for k in dists}
    failed = _ran({**top, "long": 8, "kv": 9500}, "slo")
    assert bisected_caps(top, ["long", "batch"], dists, [failed], "kv") == [{**base, "long": 7}]
    # the bracket narrows with each failure; nothing is left between 5 and 6
    assert bisected_caps(top, ["long"], dists, [failed, _ran({**top, "long": 7}, "oom")],
                         "kv") == [{**base, "long": 6}]
    assert bisected_caps(top, ["long"], dists, [_ran({**top, "long": 6}, "slo")], "kv") == []
    # a failure with other knobs, or a healthy raise, brackets nothing
    other = _ran({**top, "long": 8, "graph": False}, "slo")
    assert bisected_caps(top, ["long"], dists, [other, _ran({**top, "long": 8}, "ok")],
                         "kv") == []


def test_a_cap_never_raised_is_opened_before_a_failed_raise_is_bisected():
    """Round 34 (Mistral-7B / RTX 4090 chat): the prefill cap raised 9 -> 48 ran out of memory;
    the decode cap of 19 beside 48 requests in flight is opened before 9..48 is bisected."""
    dists = {"prefill": IntDistribution(1, 64), "decode": IntDistribution(1, 128),
             "graph": CategoricalDistribution([False, True])}
    top = {"prefill": 9, "decode": 19, "graph": True, "kv": 23466}
    base = {k: top[k] for k in dists}
    caps = {"prefill": 48, "decode": 48}
    assert cap_moves(top, caps, dists, [], "kv") == [{**base, "prefill": 48},
                                                     {**base, "decode": 48}]
    oom = _ran({**top, "prefill": 48, "kv": 24943}, "oom")
    assert cap_moves(top, caps, dists, [oom], "kv") == [
        {**base, "decode": 48}, {**base, "prefill": 29}, {**base, "prefill": 48}]
    # once the decode cap's raise has run healthy, the bracket is next
    opened = _ran({**top, "decode": 48, "kv": 23900}, "ok")
    assert cap_moves(top, caps, dists, [oom, opened], "kv")[0] == {**base, "prefill": 29}


def test_a_raised_budget_runs_at_the_incumbents_own_pool_and_once():
    """16 prompts of 1024 tokens in flight beside a 4096-token budget: the raise keeps the
    incumbent's pool (pinned to it) and goes as far as that pool still fits by the model; once
    the raised config ran there, it is not proposed again; without a KV edge, or without a
    share in the space, there is no such move."""
    edge = _edge(CHAT)
    space = {"block_size": CategoricalDistribution([16]),
             "max_batch_size": IntDistribution(1, 128),
             "max_num_batched_tokens": IntDistribution(1024, 32768, log=True),
             "enable_graph": CategoricalDistribution([False, True]),
             KV_SHARE: FloatDistribution(0.0, 1.0)}
    budgets = ["max_num_batched_tokens"]
    pool = edge.edge(KNOBS, []) // 2
    top = _healthy_at({**KNOBS, KV_SHARE: 0.5}, pool)

    def fits(params):
        return 0.0
    move = raised_budget(top, [top], space, fits, edge, budgets)
    assert move is not None
    params, pinned = move
    assert pinned == pool // 16 * 16       # the tokens its whole blocks hold
    assert 4096 < params["max_num_batched_tokens"] <= 16384
    rest = {k: v for k, v in params.items() if k != KV_SHARE}
    assert edge.room_at([top])(rest, pinned) >= 0
    ran = _healthy_at(params, pinned)
    assert raised_budget(top, [top, ran], space, fits, edge, budgets) is None
    assert raised_budget(top, [top], space, fits, None, budgets) is None
    no_share = {k: d for k, d in space.items() if k != KV_SHARE}
    assert raised_budget(top, [top], no_share, fits, edge, budgets) is None

"""Repairs of runs that missed a per-token SLO above the incumbent: budget at its top, a faster
decode step, one request fewer."""

from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space_file import load_space
from tuner.study.per_token_repairs import faster, fewer_repairs, one_fewer, topped
from tuner.study.record import KV_SHARE, TrialRecord
from tuner.trial.kv_share import KvEdge

CHAT = Cell(48, 1200, 400, 96)   # 48 requests of 1600 tokens: 76.8k
LONG = Cell(16, 6000, 200, 32)   # 16 requests of 6200 tokens, 6208 in 32-token blocks
KNOBS = {"block_size": 32, "max_batch_size": 128, "enable_graph": True,
         "disable_prefix_caching": True, "max_num_batched_tokens": 32768,
         "prefill_batch_cap": 64, "decode_batch_cap": 128, "long_context_threshold": 8192,
         "long_context_max_batch": 8, "long_context_use_total_len": True,
         "decode_first_when_running": True}


def _edge(cells: tuple[Cell, ...] = (CHAT, LONG)) -> KvEdge:
    """The memory edge of the shipped InfiniLM space for Llama-3.2-3B on a 48 GiB card."""
    root = Path(__file__).resolve().parents[2]
    model = load_model_info(root / "models" / "llama-3.2-3b")
    cap = 48 * 2 ** 30
    space = resolve_space(load_space(root / "search_spaces" / "infinilm.yaml"), model, cap, cells)
    return KvEdge(space, model, cap, cells)


def test_the_pool_drops_to_one_request_fewer_of_the_cell_it_bounds():
    """85.6k tokens hold 13 of the 6k cell's 16 requests and all 48 chat ones: the largest pool
    holding 12 is one block short of 13 requests; its blocks hold 12 requests, one more
    block would hold 13."""
    pool = one_fewer({**KNOBS, "kv_cache_tokens": 85562}, _edge())
    assert pool is not None
    assert pool // 6208 == 12 and (pool + 32) // 6208 == 13


def test_no_cut_where_a_cap_or_the_cells_concurrency_bounds_the_requests_in_flight():
    """A running-batch or decode cap of 8 admits fewer than the pool holds; a pool that holds
    every request of each cell bounds nothing; nor does one that holds a single request."""
    edge = _edge()
    for cap in ("max_batch_size", "decode_batch_cap"):
        assert one_fewer({**KNOBS, cap: 8, "kv_cache_tokens": 85562}, edge) is None
    assert one_fewer({**KNOBS, "kv_cache_tokens": 120_000}, edge) is None
    assert one_fewer({**KNOBS, "kv_cache_tokens": 85562}, _edge((CHAT,))) is None
    assert one_fewer({**KNOBS, "kv_cache_tokens": 10_000}, _edge((LONG,))) is None


def test_the_cut_is_the_least_one_over_the_cells_the_pool_bounds():
    """At 60k tokens the chat cell holds 37 of its 48 requests and the 6k cell 9 of 16: one
    chat request fewer is the smaller cut."""
    pool = one_fewer({**KNOBS, "kv_cache_tokens": 60_000}, _edge())
    assert pool is not None and pool // 1600 == 36 and (pool + 32) // 1600 == 37


SPACE = {**{k: CategoricalDistribution([v]) for k, v in KNOBS.items()},
         KV_SHARE: FloatDistribution(0.0, 1.0)}


def _run(number: int, pool: int, value: float, tpot: float, ttft: float = 0.5) -> TrialRecord:
    """A healthy run at `pool` tokens; `tpot` and `ttft` are its values over their limits."""
    dists = {**SPACE, "kv_cache_tokens": IntDistribution(1, 10 ** 7)}
    t = optuna.trial.create_trial(
        params={**KNOBS, KV_SHARE: 0.8, "kv_cache_tokens": pool}, distributions=dists,
        values=[value], user_attrs={"outcome": "slo" if max(tpot, ttft) > 1 else "ok"},
        constraints={"slo:p99_ttft_ms": ttft - 1.0, "slo:p99_tpot_ms": tpot - 1.0})
    t.number = number
    return TrialRecord.of(t)


def test_runs_that_missed_a_per_token_slo_above_the_incumbent_are_cut_the_better_first():
    """Of the runs above the incumbent's 600 tok/s that missed p99 TPOT most, the better
    first, each at its pool one request fewer, with the share that renders it; not one that
    missed the TTFT SLO most, one below the incumbent, or one whose pool bounds no cell."""
    edge = _edge()
    runs = [_run(0, 130_000, 611.0, tpot=0.9),
            _run(1, 85_562, 1337.0, tpot=1.004),
            _run(2, 92_972, 1338.0, tpot=1.07),
            _run(3, 70_000, 1300.0, tpot=1.01, ttft=1.5),
            _run(4, 60_000, 500.0, tpot=1.2),
            _run(5, 120_000, 1400.0, tpot=1.3)]
    got = fewer_repairs(runs, SPACE, edge, 1.0, 611.0)
    assert [pool for _, pool in got] == [one_fewer(runs[i].params, edge) for i in (2, 1)]
    for params, pool in got:
        rest = {k: v for k, v in params.items() if k != KV_SHARE}
        assert rest == KNOBS and edge.value(rest, params[KV_SHARE], runs) == pool
    assert fewer_repairs(runs, SPACE, None, 1.0, 611.0) == []
    assert fewer_repairs(runs, SPACE, edge, 1.0, 2000.0) == []


GENERIC = {"cap": IntDistribution(1, 128, log=True), "budget": IntDistribution(1024, 32768),
           "graphs": CategoricalDistribution([False, True])}


def _generic(number: int, budget: int, graphs: bool, value: float, tpot: float,
             ttft: float = 0.5) -> TrialRecord:
    """A healthy run of the GENERIC space; `tpot` and `ttft` over their limits."""
    t = optuna.trial.create_trial(
        params={"cap": 16, "budget": budget, "graphs": graphs}, distributions=GENERIC,
        values=[value], user_attrs={"outcome": "slo" if max(tpot, ttft) > 1 else "ok"},
        constraints={"slo:p99_ttft_ms": ttft - 1.0, "slo:p99_tpot_ms": tpot - 1.0})
    t.number = number
    return TrialRecord.of(t)


RUNS = [_generic(0, 2048, False, 80.0, tpot=1.2),
        _generic(1, 4096, True, 120.0, tpot=1.1),
        _generic(2, 4096, False, 200.0, tpot=1.1, ttft=2.0),
        _generic(3, 1024, False, 40.0, tpot=1.5),
        _generic(4, 32768, False, 90.0, tpot=1.5),
        _generic(5, 8192, False, 60.0, tpot=0.9),
        _generic(6, 2048, False, 70.0, tpot=1.1)]


def test_runs_above_the_incumbent_that_missed_a_per_token_slo_most_get_their_budget_topped():
    """Of the runs that missed p99 TPOT most with more throughput than the incumbent (50), the
    better first, each with its budget at the top (run 6's is run 0's again, which the
    proposals pass by as run); not one that missed the TTFT SLO most,
    one below the incumbent, one that met the SLOs, or one whose budget at its top would start
    no more prompts."""
    got = topped(RUNS, GENERIC, lambda p: ["budget"] if p["budget"] < 32768 else [], 1.0, 50.0)
    assert got == [{**RUNS[i].params, "budget": 32768} for i in (1, 0, 6)]
    assert topped(RUNS, GENERIC, lambda p: [], 1.0, 50.0) == []


def test_such_runs_get_the_faster_decode_step_where_they_had_it_off():
    """The same runs, the better first, with graphs turned on where they were off; each with
    the run it repairs (its pool is the repair's); one per config (run 6 has run 0's knobs);
    none for a knob the space lacks."""
    got = faster(RUNS, GENERIC, ["graphs"], 1.0, 50.0)
    assert [(t.number, cand) for t, cand in got] == [
        (4, {**RUNS[4].params, "graphs": True}), (0, {**RUNS[0].params, "graphs": True})]
    assert faster(RUNS, GENERIC, ["cuda"], 1.0, 50.0) == []
    # discounted by its miss, run 4 (90 tok/s, 50% over) keeps 60 and run 0 (80, 20%) 66.7:
    # above an incumbent of 65 only run 0; the budget's repair is not discounted
    assert [t.number for t, _ in faster(RUNS, GENERIC, ["graphs"], 1.0, 65.0)] == [0]
    assert len(topped(RUNS, GENERIC, lambda p: ["budget"], 1.0, 65.0)) == 4

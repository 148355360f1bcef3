"""Flips: a choice compared once as a pair of healthy runs, run at the incumbent's pool."""

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from tests.study.test_proposals import SPACE, _record
from tuner.study.flips import controlled_flips
from tuner.study.record import TrialRecord
from tuner.trial.kv_calibration import Calibration


def test_a_choice_is_flipped_until_two_healthy_runs_compared_it_alone():
    base = {"x": 8, "y": 0.5, "c": 16}
    ran = [_record({**base, "kv": 10}), _record({"x": 3, "y": 0.1, "c": 256, "kv": 5}, value=3.0),
           _record({"x": 2, "y": 0.2, "c": 128, "kv": 5}, value=2.0)]
    # both other choices are still uncompared; the one a better trial had comes first
    assert controlled_flips(base, ran, SPACE, "kv", 1.0) == [{**base, "c": 256}, {**base, "c": 128}]
    assert controlled_flips(base, ran, SPACE, "kv", -1.0)[0] == {**base, "c": 128}  # minimize
    # 256 compared alone (another pool does not matter): no longer flipped, wherever the base is
    ran.append(_record({**base, "c": 256, "kv": 7}, value=0.5))
    assert controlled_flips(base, ran, SPACE, "kv", 1.0) == [{**base, "c": 128}]
    # a pair whose flip ran out of memory compared nothing: 128 stays to be compared
    ran.append(_record({**base, "c": 128, "kv": 10}, outcome="oom"))
    assert controlled_flips(base, ran, SPACE, "kv", 1.0) == [{**base, "c": 128}]


def test_the_optimistic_scale_is_the_ooms_bound_not_a_bisection_step_above_it():
    cal = Calibration({False: 0, True: 0}, {"c+graph": (1.6, float("inf")), "c": (0.2, 0.9)})
    assert cal.k("c", graph=True) == 2.2           # galloping: twice the proven under-estimate
    optimistic = Calibration(cal.runtime_floor, cal.scale, optimistic=True)
    assert optimistic.k("c", graph=True) == 1.6
    assert optimistic.k("c") == cal.k("c") == 0.9  # the OOM proved less than the healthy runs


def test_a_flip_runs_at_the_incumbents_pool_where_the_model_allows():
    """Graphs flipped on at the incumbent's share would get a smaller pool (the model's graph
    need is larger); the flip keeps the pool, or the largest the model allows, and the pool is
    pinned for the trial that runs it."""
    from pathlib import Path

    from tuner.bench.records import Cell
    from tuner.search.bounds import resolve_space
    from tuner.search.model import load_model_info
    from tuner.search.space_file import load_space
    from tuner.study.flips import at_pool
    from tuner.trial.kv_share import KvEdge

    root = Path(__file__).resolve().parents[2]
    model = load_model_info(root / "models" / "llama-3.1-8b")
    cells, cap = (Cell(16, 1024, 256, 32),), 24 * 2 ** 30
    space = resolve_space(load_space(root / "search_spaces" / "infinilm.yaml"), model, cap, cells)
    edge = KvEdge(space, model, cap, cells)
    knobs = {"block_size": 16, "max_batch_size": 16, "max_num_batched_tokens": 4096,
             "enable_graph": False}
    flip = {**knobs, "enable_graph": True}
    for pool in (edge.edge(flip, []) // 2, edge.edge(knobs, [])):
        top = TrialRecord.of(optuna.trial.create_trial(
            params={**knobs, "kv_cache_tokens": pool}, values=[1.0], user_attrs={"outcome": "ok"},
            distributions={"block_size": IntDistribution(16, 256), "max_batch_size":
                           IntDistribution(1, 128), "max_num_batched_tokens":
                           IntDistribution(1024, 32768), "enable_graph":
                           CategoricalDistribution([False, True]), "kv_cache_tokens":
                           IntDistribution(pool, pool)}))
        params, pinned = at_pool({**flip, "kv_share": 0.5}, top, edge, [top])
        assert pinned == min(pool, edge.edge(flip, [top], optimistic=True))
        assert 0.0 <= params["kv_share"] <= 1.0
    assert pinned < edge.edge(knobs, [])   # the graphs' need: the incumbent's pool did not fit
    trial = optuna.create_study().ask()
    edge.pinned[trial.number] = pinned
    assert edge.suggest(trial, dict(flip), [])["kv_cache_tokens"] == pinned
    assert not edge.pinned                 # used once: a later trial of that number renders

"""The start-up design: a Latin hypercube on each number's own scale, the KV share in the upper
half of the headroom, categorical choices balanced."""

import math
import random

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.study.design import StartupDesign, corner_retry, level
from tuner.study.record import KV_SHARE, TrialRecord


def test_levels_are_positions_on_the_knobs_own_scale_and_step():
    log_int = IntDistribution(1, 128, log=True)
    assert [level(log_int, p) for p in (0.0, 0.5, 1.0)] == [1, 11, 128]
    stepped = IntDistribution(1024, 32768, step=1024)
    assert [level(stepped, p) for p in (0.0, 0.5, 1.0)] == [1024, 17408, 32768]
    mid = level(FloatDistribution(0.5, 0.95, step=0.01), 0.5)
    assert math.isclose(mid, 0.72) or math.isclose(mid, 0.73)


def test_each_stratum_of_a_knob_is_drawn_once_per_round():
    design = StartupDesign(10, random.Random(0))
    batch = IntDistribution(1, 128, log=True)
    draws = [design.draw("max_batch_size", batch) for _ in range(10)]
    strata = sorted(int(math.log(v) / math.log(128) * 10 - 1e-9) if v > 1 else 0 for v in draws)
    assert sum(v <= 2 for v in draws) <= 2           # uniform-log draws: ~2 in 10 expected, any
    assert len(set(strata)) >= 8                     # spread over the range, not clustered


def test_start_up_shares_are_in_the_upper_half_and_choices_are_balanced():
    design = StartupDesign(10, random.Random(1))
    shares = [design.draw("kv_share", FloatDistribution(0.0, 1.0)) for _ in range(10)]
    assert min(shares) >= 0.5 and max(shares) <= 1.0
    assert sorted(int((s - 0.5) * 20) for s in shares) == list(range(10))
    picks = [design.draw("bs", CategoricalDistribution([16, 256])) for _ in range(10)]
    assert picks.count(16) == 5


def test_the_first_point_has_every_request_cap_at_the_top_and_only_the_first():
    from pathlib import Path

    from tuner.search.space_file import load_space

    space = load_space(Path(__file__).resolve().parents[2] / "search_spaces" / "infinilm.yaml")
    limits = space.limits()
    assert set(limits) == {"max_batch_size", "prefill_batch_cap", "decode_batch_cap",
                           "long_context_max_batch", "long_context_threshold"}   # no budgets
    dists = {"max_batch_size": IntDistribution(1, 128, log=True),
             "decode_batch_cap": IntDistribution(1, 128, log=True),
             "max_num_batched_tokens": IntDistribution(1024, 32768, log=True),
             "block_size": CategoricalDistribution([16, 256]),
             "long_context_threshold": CategoricalDistribution([1024, 2048, 4096, 8192])}
    design = StartupDesign(10, random.Random(2), limits)
    first = design.point(dists)
    assert first["max_batch_size"] == 128 and first["decode_batch_cap"] == 128
    assert first["long_context_threshold"] == 8192   # the guard holds the fewest apart
    assert first["max_num_batched_tokens"] < 32768 and first["block_size"] in (16, 256)
    rest = [design.point(dists) for _ in range(9)]
    assert all(p["max_batch_size"] < 128 or p["decode_batch_cap"] < 128 for p in rest)


def test_a_study_that_has_its_corner_draws_no_second_one():
    """A resumed study, or a second worker, builds a new design; the corner is not repeated."""
    dists = {"max_batch_size": IntDistribution(1, 128, log=True),
             "decode_batch_cap": IntDistribution(1, 128, log=True)}
    limits = ("max_batch_size", "decode_batch_cap")
    corner = {"max_batch_size": 128, "decode_batch_cap": 128}
    fresh = StartupDesign(10, random.Random(3), limits).point(dists, [{"max_batch_size": 128}])
    assert fresh == corner                  # a config with one cap open is not the corner
    again = StartupDesign(10, random.Random(3), limits).point(dists, [{**corner, "x": 1}])
    assert again != corner and max(again.values()) <= 128


def _ran(number: int, cap: int, budget: int, outcome: str) -> TrialRecord:
    t = optuna.trial.create_trial(
        params={"cap": cap, "budget": budget, KV_SHARE: 0.8, "kv": 40_000},
        distributions={"cap": IntDistribution(1, 128), "budget": IntDistribution(1024, 32768),
                       KV_SHARE: FloatDistribution(0.0, 1.0), "kv": IntDistribution(0, 10 ** 6)},
        values=[0.0], user_attrs={"outcome": outcome})
    t.number = number
    return TrialRecord.of(t)


def test_the_corner_that_ran_out_of_memory_is_run_again_at_its_edge_once():
    space = {"cap": IntDistribution(1, 128), "budget": IntDistribution(1024, 32768),
             KV_SHARE: FloatDistribution(0.0, 1.0)}
    corner, other = _ran(1, 128, 6553, "oom"), _ran(2, 7, 2515, "slo")
    assert corner_retry([other, corner], space, ["cap"]) == {
        "cap": 128, "budget": 6553, KV_SHARE: 1.0}
    again = _ran(4, 128, 6553, "oom")                 # retried (and out of memory again)
    assert corner_retry([other, corner, again], space, ["cap"]) is None
    assert corner_retry([other, _ran(1, 128, 6553, "slo")], space, ["cap"]) is None
    assert corner_retry([other, corner], space, []) is None     # no limits: no corner


def _launched(number: int, params: dict, outcome: str) -> TrialRecord:
    dists = {"cap": IntDistribution(1, 128), "block": CategoricalDistribution([16, 128, 256]),
             "graph": CategoricalDistribution([False, True]),
             KV_SHARE: FloatDistribution(0.0, 1.0)}
    t = optuna.trial.create_trial(params={KV_SHARE: 0.6, **params}, distributions=dists,
                                  values=[0.0], user_attrs={"outcome": outcome})
    t.number = number
    return TrialRecord.of(t)


def test_the_corner_that_did_not_start_is_run_again_with_choices_that_started_at_its_edge():
    """The corner's block size never started (the server refuses it, whatever the limits):
    it runs again with the block size most started runs had, at the edge; graphs, which a run
    started with, stay; once only, and not where every run failed to start."""
    space = {"cap": IntDistribution(1, 128), "block": CategoricalDistribution([16, 128, 256]),
             "graph": CategoricalDistribution([False, True]),
             KV_SHARE: FloatDistribution(0.0, 1.0)}
    corner = _launched(1, {"cap": 128, "block": 128, "graph": True}, "startup")
    ran = [_launched(0, {"cap": 8, "block": 256, "graph": False}, "slo"),
           _launched(2, {"cap": 13, "block": 256, "graph": True}, "slo"),
           _launched(3, {"cap": 22, "block": 16, "graph": True}, "slo")]
    retry = corner_retry([ran[0], corner, *ran[1:]], space, ["cap"])
    assert retry == {"cap": 128, "block": 256, "graph": True, KV_SHARE: 1.0}
    again = _launched(4, retry, "slo")
    assert corner_retry([ran[0], corner, *ran[1:], again], space, ["cap"]) is None
    assert corner_retry([corner, _launched(2, {"cap": 9, "block": 16, "graph": True},
                                           "startup")], space, ["cap"]) is None
    started = _launched(5, {"cap": 9, "block": 128, "graph": False}, "slo")
    assert corner_retry([*ran, corner, started], space, ["cap"]) is None  # 128 started: no cue


def test_the_corner_that_missed_with_decode_first_on_is_run_again_with_it_off_at_its_edge():
    """With every cap open, decode-first is what keeps a long prompt waiting; a corner that
    missed with it off, or that met nothing for another reason, is not retried."""
    space = {"cap": IntDistribution(1, 128), "df": CategoricalDistribution([False, True]),
             KV_SHARE: FloatDistribution(0.0, 1.0)}

    def run(number: int, cap: int, df: bool, outcome: str) -> TrialRecord:
        t = optuna.trial.create_trial(params={"cap": cap, "df": df, KV_SHARE: 0.7},
                                      distributions=space, values=[0.0],
                                      user_attrs={"outcome": outcome})
        t.number = number
        return TrialRecord.of(t)
    default = run(0, 8, False, "slo")
    retry = corner_retry([default, run(1, 128, True, "slo")], space, ["cap"], lambda p: ["df"])
    assert retry == {"cap": 128, "df": False, KV_SHARE: 1.0}
    assert corner_retry([default, run(1, 128, True, "slo")], space, ["cap"]) is None
    assert corner_retry([default, run(1, 128, False, "slo")], space, ["cap"],
                        lambda p: ["df"]) is None
    assert corner_retry([default, run(1, 128, True, "slo")], space, ["cap"],
                        lambda p: []) is None          # decode-first holds nothing back there
    assert corner_retry([default, run(1, 128, True, "slo"), run(2, 128, False, "slo")],
                        space, ["cap"], lambda p: ["df"]) is None                      # once

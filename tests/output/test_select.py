"""Selection: the feasible Pareto set, the pick rules, SLO specs and robustness tie-breaks."""

from __future__ import annotations

import random

import optuna
import pytest

from tests.fakestudy import DIRECTIONS, make_study, make_trial
from tuner.errors import UsageError
from tuner.output.select import (choose, feasible_front, memory_headroom, repeat_spread,
                                 study_objectives)
from tuner.study.record import TrialRecord, is_feasible, records
from tuner.search.slo import SloTerm, parse_slo

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def study() -> optuna.Study:
    return make_study(n_ok=14, n_fail=5, seed=3)


def feasible(study):
    return [t for t in study.trials if is_feasible(t)]


def test_pareto_matches_optuna_constrained_best_trials(study):
    mine = feasible_front(records(study), study_objectives(study))
    assert [t.number for t in mine] == sorted(t.number for t in study.best_trials)
    assert all(t.outcome == "ok" for t in mine)


def test_failed_trials_are_never_feasible(study):
    for t in study.trials:
        if t.user_attrs["outcome"] != "ok":
            assert not is_feasible(t)


def test_objectives_come_from_the_study_attr(study):
    assert [str(o) for o in study_objectives(study)] == ["max output_throughput", "min p99_ttft_ms", "min p99_tpot_ms"]


@pytest.mark.parametrize("pick,metric,sign", [("max-throughput", "output_throughput", -1),
                                              ("min-ttft", "p99_ttft_ms", 1), ("min-tpot", "p99_tpot_ms", 1)])
def test_metric_picks_take_the_best_feasible(study, pick, metric, sign):
    got = choose(study, pick).trial
    best = min(sign * t.user_attrs["metrics"][metric] for t in feasible(study))
    assert sign * got.metrics[metric] <= best + 0.01 * abs(best)


def test_knee_is_on_the_front_and_not_an_extreme_when_a_compromise_exists(study):
    choice = choose(study, "knee")
    assert choice.trial in choice.pareto
    assert len(choice.pareto) > 2


def test_slo_pick_meets_every_term_and_maximises_throughput(study):
    terms = parse_slo("ttft_p99<=1.2s,cell:c64_i256_o256:tpot_p99<=45ms")
    choice = choose(study, "slo", terms)
    metrics = choice.trial.metrics
    cell = next(c for c in choice.trial.cells if c["cell"]["concurrency"] == 64)
    assert metrics["p99_ttft_ms"] <= 1200 and cell["metrics"]["p99_tpot_ms"] <= 45
    meeting = [t for t in feasible(study) if t.user_attrs["metrics"]["p99_ttft_ms"] <= 1200
               and t.user_attrs["cells"][1]["metrics"]["p99_tpot_ms"] <= 45]
    assert metrics["output_throughput"] >= 0.99 * max(t.user_attrs["metrics"]["output_throughput"] for t in meeting)


def test_unmeetable_slo_names_the_closest_trial(study):
    with pytest.raises(UsageError, match=r"closest is trial \d+, which misses p99_ttft_ms<=1 \(is "):
        choose(study, "slo", parse_slo("ttft_p99<=1ms"))


def test_unmeetable_slo_prints_rounded_values(study):
    with pytest.raises(UsageError) as err:
        choose(study, "slo", parse_slo("ttft_p99<=1ms"))
    seen = str(err.value).rsplit("(is ", 1)[1].rstrip(")")
    assert len(seen.split(".")[-1]) <= 2, seen    # e.g. 3,223.5, not 3223.4948527504853


def test_unknown_slo_metric_and_cell_are_clear_errors(study):
    with pytest.raises(UsageError, match="unknown SLO metric 'p99_foo_ms'"):
        choose(study, "knee", parse_slo("foo_p99<=1ms"))
    with pytest.raises(UsageError, match="unknown cell 'c1_i2_o3'.*c4_i4096_o64"):
        choose(study, "knee", parse_slo("cell:c1_i2_o3:ttft_p99<=1ms"))


@pytest.mark.parametrize("spec,term", [
    ("ttft_p99<=2000ms", SloTerm("p99_ttft_ms", "<=", 2000.0)),
    ("p99_tpot_ms < 0.05s", SloTerm("p99_tpot_ms", "<", 50.0)),
    ("output_throughput>=100tok/s", SloTerm("output_throughput", ">=", 100.0)),
    ("cell:c64_i256_o256:tpot_mean<=40", SloTerm("mean_tpot_ms", "<=", 40.0, "c64_i256_o256")),
])
def test_slo_syntax(spec, term):
    assert parse_slo(spec) == [term]


@pytest.mark.parametrize("spec", ["ttft_p99=2000", "ttft_p99<=fast", "output_throughput<=5ms",
                                  "ttft_p99<=5tok/s", "cell:64:ttft_p99<=1", ","])
def test_bad_slo_syntax_is_a_usage_error(spec):
    with pytest.raises(UsageError):
        parse_slo(spec)


def test_pick_slo_needs_slo(study):
    with pytest.raises(UsageError, match="--pick slo needs --slo"):
        choose(study, "slo")


def test_no_feasible_trial_says_why():
    study = make_study(n_ok=0, n_fail=4, all_fail=True)
    with pytest.raises(UsageError, match=r"no feasible trial in study 'demo': 5 trials: .*oom.*crash"):
        choose(study)


def _twins(extra_a: dict, extra_b: dict) -> optuna.Study:
    """Two trials with identical values that differ only in robustness attrs."""
    study = optuna.create_study(directions=DIRECTIONS)
    study.set_user_attr("objectives", ["max output_throughput", "min p99_ttft_ms", "min p99_tpot_ms"])
    params = {"num_blocks": 64, "block_size": 16, "prefill_cap": 4, "decode_first": True, "enable_graph": True}
    for n, extra in enumerate((extra_a, extra_b)):
        study.add_trial(make_trial(n, params, rng=random.Random(0), extra_attrs=extra))
    return study


def test_ties_go_to_more_memory_headroom():
    study = _twins({"predicted_peak_bytes": 70 * 2**30}, {"predicted_peak_bytes": 40 * 2**30})
    for pick in ("knee", "max-throughput", "min-ttft"):
        choice = choose(study, pick)
        assert choice.trial.number == 1 and "robustness" in choice.rule
    assert memory_headroom(TrialRecord.of(study.trials[1])) == pytest.approx(0.5)


def test_seen_peak_beats_predicted_for_headroom():
    study = _twins({"peak_bytes": 30 * 2**30}, {"peak_bytes": 50 * 2**30})
    assert choose(study).trial.number == 0


def test_ties_then_go_to_less_spread_over_repeats():
    steady = [{"output_throughput": 100.0}, {"output_throughput": 101.0}]
    noisy = [{"metrics": {"output_throughput": 80.0}}, {"metrics": {"output_throughput": 120.0}}]
    study = _twins({"repeats": noisy}, {"repeats": steady})
    assert choose(study, "max-throughput").trial.number == 1
    assert repeat_spread(TrialRecord.of(study.trials[0]), "output_throughput") == pytest.approx(0.2)

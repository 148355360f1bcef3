"""One-knob-at-a-time ablation: a knob the server ignores is reported as having no effect."""

from pathlib import Path

import pytest

from tuner.output.ablation import ablate, alternatives
from tuner.server.outcome import Outcome
from tuner.search.space import Param
from tuner.trial.result import TrialResult

LIVE = Param(name="live", type="int", low=1, high=64, flag="--live")
DEAD = Param(name="dead", type="int", low=1, high=64, env="DEAD")
FATAL = Param(name="fatal", type="bool", flag="--fatal")
METRICS = ["output_throughput", "p99_ttft_ms"]


def fake_runner(ctx, params, trial_dir: Path) -> TrialResult:
    """A server that reads `live` and `fatal` and ignores `dead`; 1% run-to-run noise."""
    noise = 1.01 if trial_dir.name == "base-1" else 1.0
    if params.get("fatal"):
        return TrialResult(Outcome("oom", "boom"), {}, [], [], {}, 0.0)
    tput = 100.0 * params["live"] / 8 * noise
    return TrialResult(Outcome("ok", ""), {"output_throughput": tput, "p99_ttft_ms": 500.0 * noise},
                       [], [], {}, 0.0)


def test_dead_knob_has_no_effect_live_and_fatal_knobs_do(tmp_path):
    base = {"live": 8, "dead": 8, "fatal": False}
    report = ablate(None, base, [LIVE, DEAD, FATAL], METRICS, tmp_path, repeats=2, runner=fake_runner)
    assert report.noise["output_throughput"] == pytest.approx(0.005, rel=0.05)
    assert report.band["output_throughput"] == 0.02  # the floor beats twice the noise here
    assert report.verdict("dead") == "no effect"
    assert report.verdict("live") == "effect"
    assert report.verdict("fatal") == "effect (changes the outcome)"
    assert report.verdict("other") == "not varied"
    assert {(v.knob, v.value) for v in report.variants} == {
        ("live", 1), ("live", 64), ("dead", 1), ("dead", 64), ("fatal", True)}


def test_unhealthy_base_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="base config"):
        ablate(None, {"live": 8, "fatal": True}, [LIVE], METRICS, tmp_path, runner=fake_runner)


def test_alternatives_cover_the_range_ends_and_other_choices():
    assert alternatives(LIVE, 1) == [64]
    assert alternatives(FATAL, True) == [False]
    cat = Param(name="c", type="categorical", choices=(16, 32, 64, 256), flag="--c")
    assert alternatives(cat, 32) == [16, 64]


def test_one_value_per_knob_tries_the_low_end_only(tmp_path):
    base = {"live": 8, "dead": 8, "fatal": False}
    report = ablate(None, base, [LIVE, DEAD], METRICS, tmp_path, per_knob=1, runner=fake_runner)
    assert [(v.knob, v.value) for v in report.variants] == [("live", 1), ("dead", 1)]
    assert report.verdict("live") == "effect" and report.verdict("dead") == "no effect"

"""The fANOVA knob check: dead knobs flagged, live ones not, and no verdict on a knob the trials
hardly varied (the H200 InfiniLM study had enable_graph off in one trial of ten)."""

import random

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution

from tuner.output.knob_check import describe, knob_report

DISTS = {"live": FloatDistribution(1, 64), "dead": FloatDistribution(1, 64),
         "rare": CategoricalDistribution([False, True])}


def _study(n: int = 30) -> optuna.Study:
    study = optuna.create_study(directions=["maximize"])
    rng = random.Random(0)
    for i in range(n):
        live, dead = float(rng.uniform(1, 64)), float(rng.uniform(1, 64))
        study.add_trial(optuna.trial.create_trial(
            params={"live": live, "dead": dead, "rare": i == 0}, distributions=DISTS,
            values=[10.0 * live], user_attrs={"outcome": "ok"}))
    return study


def test_dead_knob_flagged_live_knob_not_rare_knob_left_undecided():
    rep = knob_report(_study())
    assert rep is not None and rep.trials_used == 30
    assert rep.importance["live"]["objective 0"] > 0.9
    assert rep.no_effect == ["dead"]
    assert rep.barely_varied == ["rare"]
    text = describe(rep)
    assert "too little varied to judge" in text and "tuner ablate --knobs dead,rare" in text


def test_too_few_ok_trials_give_no_report():
    assert knob_report(_study(4)) is None
    assert "needs at least 5" in describe(None)

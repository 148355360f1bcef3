"""tune's closing summary."""

import optuna

from tuner.commands.tune_messages import print_summary
from tuner.study.record import add_confirmation


def test_a_pick_that_did_not_hold_is_counted_by_its_confirmation(capsys):
    """Trial 0 met the SLO once; its confirmation (trial 2) missed it in a run: the summary
    counts one miss for that config, not an ok, and says a confirmation stood in for it."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    dist = {"cap": optuna.distributions.IntDistribution(1, 8)}
    for cap, outcome, miss in ((4, "ok", -0.1), (8, "slo", 0.3)):
        study.add_trial(optuna.trial.create_trial(
            params={"cap": cap}, distributions=dist, values=[1.0],
            constraints={"slo:p99_ttft_ms": miss}, user_attrs={"outcome": outcome}))
    original = study.get_trials()[0]
    add_confirmation(study, original, [0.9], {"slo:p99_ttft_ms": 0.2}, {"outcome": "slo"})
    print_summary(study)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "outcomes: slo=2 (confirmations counted in place of the trials they re-ran: 1)"

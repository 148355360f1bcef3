"""--trials counts measured configs; --max-skips ends a run of skips; --patience stops early."""

import optuna
import pytest

from tuner.study.budget import Convergence, finished, run_to_budget
from tuner.study.objective import counted


def _objective(skip_every: int | None, values=lambda n: float(n)):
    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("x", 0, 100)
        trial.set_constraint("feasible", 0.0)
        skipped = skip_every is not None and trial.number % skip_every == 0
        trial.set_user_attr("outcome", "skipped" if skipped else "ok")
        trial.set_user_attr("metrics", {"output_throughput": values(trial.number)})
        return values(trial.number)
    return objective


def _study():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(directions=["maximize"],
                               sampler=optuna.samplers.RandomSampler(seed=0))


def test_skips_do_not_use_up_the_budget(tmp_path):
    study = _study()
    run_to_budget(study, _objective(skip_every=2), 5, tmp_path)
    assert finished(study) == len(counted(study)) == 5
    assert sum(t.user_attrs["outcome"] == "skipped" for t in study.trials) == 5


def test_max_skips_ends_a_run_of_skips(tmp_path):
    study = _study()
    run_to_budget(study, _objective(skip_every=1), 5, tmp_path, max_skips=3)
    assert finished(study) == 0 and len(study.trials) == 3


@pytest.mark.parametrize("patience", [2, 4])
def test_convergence_stops_when_the_pick_has_not_changed(tmp_path, patience):
    study = _study()
    study.set_user_attr("objectives", ["max output_throughput"])
    stop = Convergence(patience)
    best_at = 3
    run_to_budget(study, _objective(None, lambda n: 10.0 * n if n <= best_at else 1.0), 20, tmp_path,
                  convergence=stop)
    assert finished(study) == best_at + 1 + patience
    assert "trial 3" in stop.fired and f"--patience {patience}" in stop.fired

"""The memory pre-screen replayed on real OOMs: transformers serve on an H200 capped at 8 GiB.

benchmarks/results/h200/study_cap8.db holds 7 configs run for real (Llama-3.2-1B shape, the
h200 workload): 5 died of memory, 2 ran.  The pre-screen's prior estimate, with no study history,
must skip every one that died and none that ran.
"""

from pathlib import Path

import optuna

from tuner.memory import estimate, knobs_from_params
from tuner.modelinfo import load_model_info
from tuner.prescreen import decide
from tuner.space import load_space
from tuner.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]


def test_prior_estimate_separates_the_real_ooms_from_the_healthy_configs():
    space = load_space(ROOT / "search_spaces" / "transformers.yaml")
    cells = list(load_workload(ROOT / "benchmarks" / "h200" / "workload.yaml").cells)
    model = load_model_info(ROOT / "models" / "llama-3.2-1b")
    db = ROOT / "benchmarks" / "results" / "h200" / "study_cap8.db"
    study = optuna.load_study(study_name="cap8b", storage=f"sqlite:///{db}")
    seen = {"oom": 0, "ok": 0}
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        est = estimate(model, knobs_from_params(space, t.params), cells)
        skip = decide(est, 8 * 2**30, []).skip
        assert skip == (t.user_attrs["outcome"] == "oom"), (t.number, t.user_attrs["outcome"], est.need)
        seen[t.user_attrs["outcome"]] += 1
    assert seen == {"oom": 5, "ok": 2}

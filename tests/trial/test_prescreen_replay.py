"""The memory pre-screen replayed on real OOMs on an H200 (Llama-3.2-1B shape, the h200 workload).

* transformers serve capped at 8 GiB (benchmarks/results/h200/study_cap8.db): 7 configs, 5 died
  of memory, 2 ran;
* InfiniLM behind a 12 GiB ballast (benchmarks/results/infinilm-h200/capped_study.db, run with
  --no-prescreen): 6 configs, 3 failed to allocate their KV pool at start-up, 1 ran out of memory
  under load, 2 ran; and the same InfiniLM on the whole card (study.db): 10 configs, all ran.

The pre-screen's prior estimate, with no study history, must skip every one that died and none
that ran.
"""

from pathlib import Path

import optuna
import pytest

from tuner.trial.memory_estimate import estimate, knobs_from_params
from tuner.search.model import load_model_info
from tuner.study.record import records
from tuner.trial.prescreen import decide
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


RESULTS = ROOT / "benchmarks" / "results"
CASES = [  # space, study db, study name, card bytes, expected outcomes
    ("search_spaces/transformers.yaml", RESULTS / "h200" / "study_cap8.db", "cap8b", 8 * 2**30,
     {"oom": 5, "ok": 2}),
    ("benchmarks/results/infinilm-h200/capped_space.yaml", RESULTS / "infinilm-h200" / "capped_study.db",
     "infinilm-h200-1b-cap12", 12 * 2**30, {"oom": 4, "ok": 2}),
    ("search_spaces/infinilm.yaml", RESULTS / "infinilm-h200" / "study.db", "infinilm-h200-1b",
     143771 * 2**20, {"ok": 10}),
]


@pytest.mark.parametrize("space_file,db,name,card,expected", CASES,
                         ids=["transformers-8g", "infinilm-12g", "infinilm-h200"])
def test_prior_estimate_separates_the_real_ooms_from_the_healthy_configs(space_file, db, name, card,
                                                                        expected):
    space = load_space(ROOT / space_file)
    cells = list(load_workload(ROOT / "benchmarks" / "h200" / "workload.yaml").cells)
    model = load_model_info(ROOT / "models" / "llama-3.2-1b")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    seen = {k: 0 for k in expected}
    for t in records(study, (optuna.trial.TrialState.COMPLETE,)):
        est = estimate(model, knobs_from_params(space, dict(t.params)), cells)
        skip = decide(est, card, []).skip
        assert skip == (t.outcome == "oom"), (t.number, t.outcome, est.need)
        seen[t.outcome] += 1
    assert seen == expected

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


def test_the_calibrated_need_runs_the_pushes_to_the_edge_the_estimate_alone_skipped():
    """benchmarks/results/h200-transformers-8b-r11: Llama-3.1-8B shape under 24 GiB.  Trials 6,
    14, 18 and 22, each incumbent pushed to its edge, were skipped on the estimate (27.9-28.7
    GiB); launched afterwards (skipcheck.db) all four ran healthy.  Replayed with the trials
    before each, the need calibrated on the memory marks runs every one."""
    from tuner.search.bounds import resolve_space
    from tuner.trial.kv_share import KvEdge
    from tuner.trial.prescreen import calibrated_runtime

    r11 = RESULTS / "h200-transformers-8b-r11"
    cells = list(load_workload(ROOT / "benchmarks" / "h200" / "workload.yaml").cells)
    model = load_model_info(ROOT / "models" / "llama-3.1-8b")
    cap = 24 * 2**30
    space = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), model, cap,
                          cells)
    edge = KvEdge(space, model, cap, tuple(cells))
    study = records(optuna.load_study(study_name="h200-transformers-8b-r11-cap24",
                                      storage=f"sqlite:///{r11 / 'study.db'}"),
                    (optuna.trial.TrialState.COMPLETE,))
    launched = records(optuna.load_study(study_name="skipcheck",
                                         storage=f"sqlite:///{r11 / 'skipcheck.db'}"),
                       (optuna.trial.TrialState.COMPLETE,))
    pool = {t.params["cb_num_blocks"]: t.outcome for t in launched}
    skipped = [t for t in study if t.outcome == "skipped"]
    assert [t.number for t in skipped] == [6, 14, 18, 22]
    for t in skipped:
        before = [b for b in study if b.number < t.number]
        params = dict(t.params)
        knobs = knobs_from_params(space, params)
        est = estimate(model, knobs, cells, runtime=calibrated_runtime(before, knobs.cuda_graph))
        assert decide(est, cap, before).skip
        assert not decide(est, cap, before, edge.calibrated_need(params, before),
                          knobs.cuda_graph).skip
        assert pool[params["cb_num_blocks"]] == "ok"


def test_the_footprint_check_names_exactly_the_refusals_of_every_8b_h200_study():
    """Every committed transformers-serve study of the Llama-3.1-8B shape on the H200 under
    24 GiB (r8-r14): a run that ran is never refused by the modelled footprint check, with the
    runtime its own idle memory measured; every run the server refused with `Memory footprint
    ... is more than available memory` is."""
    from tuner.trial.memory_estimate import GIB
    from tuner.trial.prescreen import estimate_attr, refused_by_check

    model = load_model_info(ROOT / "models" / "llama-3.1-8b")
    space = load_space(ROOT / "search_spaces" / "transformers.yaml")
    cells = list(load_workload(ROOT / "benchmarks" / "h200" / "workload.yaml").cells)
    seen = {True: 0, False: 0}
    for db in sorted(RESULTS.glob("h200-transformers-8b*/**/*.db")):
        storage = f"sqlite:///{db}"
        for summary in optuna.get_all_study_summaries(storage):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            for t in records(study, (optuna.trial.TrialState.COMPLETE,)):
                if t.outcome not in ("ok", "slo", "oom") or not t.idle_bytes:
                    continue
                est = estimate(model, knobs_from_params(space, dict(t.params)), cells)
                refused = "Memory footprint" in t.reason
                runtime = int(t.idle_bytes) - est.weights
                assert refused_by_check(estimate_attr(est, False), runtime, 24 * GIB) == refused, \
                    (db.parent.name, t.number, t.outcome)
                seen[refused] += 1
    assert seen[True] >= 16 and seen[False] >= 150

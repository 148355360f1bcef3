"""`tune` resumed: `--resume` continues a study to the new total and samples configs it has not
run yet (a resumed sampler does not replay the first run's proposals)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tests.fakestudy import TINY_WORKLOAD
from tuner.cli import main
from tuner.paths import REPO_ROOT
from tuner.study.storage import open_storage
from tuner.study.sampler import run_seed



def test_resume_continues_to_the_new_total_with_new_configs(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(TINY_WORKLOAD)
    argv = ["tune", "--model", str(REPO_ROOT / "models" / "llama-3.2-1b"), "--simulate", "rtx4090",
            "--workload", str(workload), "--study", "r", "--studies-dir", str(tmp_path),
            "--sampler", "random", "--time-scale", "100", "--no-export"]
    assert main([*argv, "--trials", "2"]) == 0
    assert main([*argv, "--trials", "4", "--resume"]) == 0
    study = optuna.load_study(study_name="r", storage=f"sqlite:///{tmp_path}/r/study.db")
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert [t.number for t in complete] == [0, 1, 2, 3]
    assert len({t.user_attrs["config_key"] for t in complete}) == 4
    assert not any("cached_from" in t.user_attrs for t in complete)


def test_run_seed_moves_on_with_the_trials_and_the_worker(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/s.db")
    assert run_seed(storage, "s", 7, None) == 7  # a new study keeps --seed
    study = optuna.create_study(study_name="s", storage=storage)
    for _ in range(3):
        study.tell(study.ask(), 1.0)
    assert run_seed(storage, "s", 7, None) == 10
    assert run_seed(storage, "s", 7, 1) != run_seed(storage, "s", 7, 0)

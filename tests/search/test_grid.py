"""`--sampler grid`: every grid point exactly once, across resumes, with or without the default."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from tests.fakestudy import TINY_WORKLOAD
from tuner.cli import main
from tuner.paths import REPO_ROOT
from tuner.search.grid import grid_configs
from tuner.search.space_file import load_space
from tuner.study.record import config_key, records

# Two knobs with a default, one of them off its 3-point axis: 3 x 4 = 12 points with the default
# enqueued (its value joins the axis), 3 x 3 = 9 without.
SPACE = """\
name: gridtest
server:
  command: ["false"]
  simulator: ["{python}", "-m", "tuner.sim", "--model", "{model}", "--host", "{host}",
              "--port", "{port}", "--gpu", "{gpu}", "--time-scale", "{time_scale}"]
fixed_flags: ["--num-blocks", "64", "--block-size", "256"]
parameters:
  max_batch_size: {type: int, low: 2, high: 32, log: true, flag: --max-batch-size, default: 8}
  prefill_cap: {type: int, low: 1, high: 16, log: true, env: INFINILM_PREFILL_BATCH_CAP,
                default: 3}
"""


@pytest.fixture
def argv(tmp_path):
    (tmp_path / "w.yaml").write_text(TINY_WORKLOAD)
    (tmp_path / "s.yaml").write_text(SPACE)
    return ["tune", "--model", str(REPO_ROOT / "models" / "llama-3.2-1b"), "--simulate",
            "rtx4090", "--workload", str(tmp_path / "w.yaml"), "--space", str(tmp_path / "s.yaml"),
            "--study", "g", "--studies-dir", str(tmp_path), "--sampler", "grid",
            "--time-scale", "200", "--no-export", "--screen-cells", "0"]


def _complete(tmp_path):
    study = optuna.load_study(study_name="g", storage=f"sqlite:///{tmp_path}/g/study.db")
    return records(study, (TrialState.COMPLETE,))


@pytest.mark.parametrize("defaults", [True, False], ids=["default-enqueued", "no-defaults"])
def test_grid_resumed_three_times_visits_every_point_once(tmp_path, argv, defaults):
    extra = [] if defaults else ["--no-defaults"]
    default = {"max_batch_size": 8, "prefill_cap": 3} if defaults else None
    grid = {config_key(c) for c in grid_configs(load_space(tmp_path / "s.yaml"), include=default)}
    assert len(grid) == (12 if defaults else 9)
    for step, total in enumerate((2, 5, 7, len(grid))):
        assert main([*argv, *extra, "--trials", str(total), "--seed", str(step)]) == 0
        done = _complete(tmp_path)
        keys = [config_key(t.params) for t in done]
        assert len(done) == total and len(set(keys)) == total and set(keys) <= grid
        assert not any(t.cached_from is not None for t in done)
    defaults_run = [t for t in _complete(tmp_path) if t.is_default]
    if defaults:
        assert len(defaults_run) == 1 and defaults_run[0].number == 0
        assert defaults_run[0].params == default
    else:
        assert defaults_run == []


def test_a_budget_past_the_grid_is_capped(tmp_path, argv, capsys):
    space = load_space(tmp_path / "s.yaml")
    small = SPACE.replace("low: 2, high: 32", "low: 8, high: 8").replace(
        "low: 1, high: 16", "low: 3, high: 3")
    (tmp_path / "s.yaml").write_text(small)
    assert len(grid_configs(load_space(tmp_path / "s.yaml"))) == 1 < len(grid_configs(space))
    assert main([*argv, "--trials", "3"]) == 0
    assert "the grid has 1 points; running 1, not 3" in capsys.readouterr().out
    assert len(_complete(tmp_path)) == 1

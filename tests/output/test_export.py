"""`tuner export`: best.env / json / yaml with provenance; clean failures with exit 2 and no file."""

from __future__ import annotations

import json
import os
import random
import time

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import create_trial

from tests.fakestudy import make_study_dir, make_trial, run_cli
from tuner.study.record import TrialRecord
from tuner.output import envfile
from tuner.output.export import tuned_args

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def studies(tmp_path):
    make_study_dir(tmp_path / "studies")
    return tmp_path / "studies"


def test_env_export_has_provenance_env_and_args(studies, capsys):
    assert run_cli(["export", "--studies-dir", str(studies)]) == 0
    text = (studies / "demo" / "best.env").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for needle in ("tuner 0.1.0", "NVIDIA H200 (141 GiB)", "/models/TinyLlama-1.1B", "infinilm-test:abc123",
                   "study: demo", "trial: ", "output_throughput=", "p99_ttft_ms=", "pick: knee"):
        assert needle in header
    values = envfile.parse(text)
    assert set(values) == {"INFINILM_PREFILL_BATCH_CAP", "INFINILM_DECODE_FIRST_WHEN_RUNNING", "TUNER_SERVER_ARGS"}
    assert "wrote " in capsys.readouterr().err


def test_simulated_studies_say_so(tmp_path, capsys):
    study = make_study_dir(tmp_path / "studies")
    assert run_cli(["export", "--studies-dir", str(tmp_path / "studies"), "-o", "-"]) == 0
    assert "simulator" not in capsys.readouterr().out
    study.set_user_attr("simulated", True)
    assert run_cli(["export", "--studies-dir", str(tmp_path / "studies"), "-o", "-"]) == 0
    assert "# WARNING: measured on the simulator" in capsys.readouterr().out


def test_values_are_what_the_server_got(studies):
    assert run_cli(["export", "--studies-dir", str(studies), "--format", "json", "-o", str(studies / "b.json")]) == 0
    doc = json.loads((studies / "b.json").read_text())
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    trial = study.trials[doc["provenance"]["trial"]]
    assert doc["env"] == {k: trial.user_attrs["env"][k] for k in doc["env"]}
    argv = trial.user_attrs["argv"]
    assert " ".join(doc["server_args"]) in " ".join(argv)
    assert ("--enable-graph" in doc["server_args"]) == trial.params["enable_graph"]
    assert doc["params"] == trial.params


def test_yaml_and_stdout(studies, capsys):
    assert run_cli(["export", "--studies-dir", str(studies), "--format", "yaml", "--pick", "min-ttft"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["provenance"]["pick"].startswith("min-ttft")
    assert doc["provenance"]["gpu"] == "NVIDIA H200 (141 GiB)"
    assert not (studies / "demo" / "best.env").exists()


def test_no_feasible_trial_exits_2_and_writes_nothing(tmp_path, capsys):
    make_study_dir(tmp_path / "studies", "broken", n_ok=0, n_fail=3, all_fail=True)
    out = tmp_path / "best.env"
    assert run_cli(["export", "--studies-dir", str(tmp_path / "studies"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no feasible trial" in err and "oom" in err
    assert not out.exists() and not (tmp_path / "studies" / "broken" / "best.env").exists()


def test_hostile_env_value_exits_2_naming_the_key_and_leaves_old_file(studies, capsys):
    storage = f"sqlite:///{studies / 'demo' / 'study.db'}"
    study = optuna.load_study(study_name="demo", storage=storage)
    bad = make_trial(99, dict(study.trials[0].params), rng=random.Random(1),
                     extra_attrs={"env": {"INFINILM_PREFILL_BATCH_CAP": "$(touch pwned)"}})
    study.add_trial(bad)
    n = study.trials[-1].number
    (studies / "demo" / "best.env").write_text("OLD=1\n")
    assert run_cli(["export", "--studies-dir", str(studies), "--trial", str(n)]) == 2
    assert "INFINILM_PREFILL_BATCH_CAP" in capsys.readouterr().err
    assert (studies / "demo" / "best.env").read_text() == "OLD=1\n"
    assert [p.name for p in (studies / "demo").iterdir() if p.name.startswith(".best.env")] == []


def test_trial_option_refuses_infeasible(studies, capsys):
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    oom = next(t.number for t in study.trials if t.user_attrs["outcome"] == "oom")
    assert run_cli(["export", "--studies-dir", str(studies), "--trial", str(oom)]) == 2
    assert "not feasible (outcome oom)" in capsys.readouterr().err


def test_default_study_is_the_latest_and_storage_url_works(tmp_path, capsys):
    root = tmp_path / "studies"
    make_study_dir(root, "older")
    make_study_dir(root, "newer")
    past = time.time() - 100
    os.utime(root / "older" / "study.db", (past, past))
    assert run_cli(["export", "--studies-dir", str(root), "-o", "-"]) == 0
    assert "study: newer" in capsys.readouterr().out
    url = f"sqlite:///{root / 'older' / 'study.db'}"
    assert run_cli(["export", "--storage", url, "--format", "json", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["study"] == "older"


def test_missing_study_is_a_usage_error(tmp_path, capsys):
    assert run_cli(["export", "--studies-dir", str(tmp_path)]) == 2
    assert "no study found" in capsys.readouterr().err
    assert run_cli(["export", "--studies-dir", str(tmp_path), "--study", "nope"]) == 2


def test_check_validates_an_env_file(studies, tmp_path, capsys):
    assert run_cli(["export", "--studies-dir", str(studies)]) == 0
    assert run_cli(["export", "--check", str(studies / "demo" / "best.env")]) == 0
    assert "TUNER_SERVER_ARGS=" in capsys.readouterr().out
    bad = tmp_path / "bad.env"
    bad.write_text('A="x y"\n')
    assert run_cli(["export", "--check", str(bad)]) == 2


def test_help_documents_slo_syntax_and_env_rule(capsys):
    with pytest.raises(SystemExit):
        run_cli(["export", "--help"])
    out = capsys.readouterr().out
    assert "cell:c<C>_i<I>_o<O>" in out and "[A-Za-z0-9_./:,=+@%-]" in out and "knee" in out


def test_study_without_flag_params_is_refused(tmp_path, capsys):
    study = make_study_dir(tmp_path / "studies")
    study.set_user_attr("flag_params", None)
    assert run_cli(["export", "--studies-dir", str(tmp_path / "studies")]) == 2
    assert "does not record which flags and variables are tuned" in capsys.readouterr().err


def test_flag_tokens_follow_the_rendered_argv():
    trial = create_trial(
        values=[1.0], params={"blocks": 64, "graph": True, "eager": False, "size": 16},
        distributions={"blocks": IntDistribution(1, 100), "graph": CategoricalDistribution([False, True]),
                       "eager": CategoricalDistribution([False, True]), "size": IntDistribution(1, 100)},
        user_attrs={"argv": ["srv", "--tp", "1", "--graph", "--blocks=64", "--size", "16"]})
    flags = {"blocks": "--blocks", "graph": "--graph", "eager": "--eager", "size": "--size"}
    assert tuned_args(TrialRecord.of(trial), flags) == ["--graph", "--blocks=64", "--size", "16"]


def test_knobs_ablate_found_dead_are_named_in_the_header(studies):
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    study.set_user_attr("ablation", {"base_trial": 3, "band": {}, "verdicts": {
        "prefill_cap": "no effect", "enable_graph": "no effect", "num_blocks": "effect"}})
    assert run_cli(["export", "--studies-dir", str(studies)]) == 0
    text = (studies / "demo" / "best.env").read_text()
    line = next(x for x in text.splitlines() if "tuner ablate" in x)
    assert line == ("# tuner ablate (around trial 3): no effect on this server, within the noise: "
                    "INFINILM_PREFILL_BATCH_CAP, --enable-graph")
    assert "INFINILM_PREFILL_BATCH_CAP" in envfile.parse(text)  # kept: the config as measured


def test_slo_pick_names_its_limits_in_best_env(studies):
    assert run_cli(["export", "--studies-dir", str(studies), "--pick", "slo",
                    "--slo", "ttft_p99<=2s,tpot_p99<=60ms"]) == 0
    header = [line for line in (studies / "demo" / "best.env").read_text().splitlines()
              if "pick:" in line][0]
    assert "pick: slo within --slo p99_ttft_ms<=2000,p99_tpot_ms<=60" in header

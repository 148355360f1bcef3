"""`tuner tune --simulate` with `max capacity_rps`: the search runs on each trial's server (HTTP),
the trial records its load steps, and report.html draws latency against load."""

from __future__ import annotations

import optuna
import yaml

from tuner.cli import main
from tuner.paths import REPO_ROOT

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")


def test_tune_on_capacity(tmp_path, capsys):
    wl = tmp_path / "cap.yaml"
    wl.write_text(yaml.safe_dump({
        "warmup": None,
        "cells": [{"source": {"shared_prefix": {"groups": 2, "prefix_len": 256, "suffix_len": 16,
                                                "turns": 2, "output_len": 16}},
                   "concurrency": 8, "request_rate": 0.5}],
        "slo": {"p99_ttft_ms": 2000, "p99_tpot_ms": 100},
        "capacity": {"min_rate": 0.5, "max_rate": 32, "resolution": 1.0, "step_requests": 16},
        "objectives": ["max capacity_rps"]}))
    space = tmp_path / "space.yaml"
    raw = yaml.safe_load((REPO_ROOT / "search_spaces" / "infinilm.yaml").read_text())
    raw["parameters"] = {"max_batch_size": {**raw["parameters"]["max_batch_size"], "high": 16},
                         "disable_prefix_caching": raw["parameters"]["disable_prefix_caching"]}
    raw["fixed_flags"] += ["--num-blocks", "64", "--block-size", "64"]
    space.write_text(yaml.safe_dump(raw))
    studies = tmp_path / "studies"
    assert main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--trials", "2",
                 "--study", "cap", "--studies-dir", str(studies), "--sampler", "random",
                 "--workload", str(wl), "--space", str(space), "--time-scale", "100"]) == 0
    capsys.readouterr()
    study = optuna.load_study(study_name="cap",
                              storage=f"sqlite:///{studies / 'cap' / 'study.db'}")
    for t in study.get_trials():
        cap = t.user_attrs["capacity_search"]
        assert t.values[0] == cap["capacity_rps"] == t.user_attrs["metrics"]["capacity_rps"] > 0
        assert cap["steps"][0]["rate"] == 0.5 and cap["steps"][0]["passed"]
    html = (studies / "cap" / "report.html").read_text()
    assert "id='capacity'" in html and "Latency vs load" in html

"""Two workers (`tune --gpus 0,1`) sharing one study through Optuna's journal file
(`--storage journal:PATH`): one host, no database server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.paths import REPO_ROOT
from tuner.server.process import stop_group
from tuner.study.storage import as_storage, open_storage

TRIALS = 4
WORKLOAD = """\
name: journal
seed: 0
warmup: {requests: 1, input_len: 16, output_len: 4}
cells:
  - {concurrency: 4, input_len: 1024, output_len: 64, num_prompts: 8}
objectives: ["max output_throughput"]
"""


def test_journal_url_opens_a_journal_file(tmp_path):
    url = f"journal:{tmp_path / 'sub' / 'j.log'}"
    storage = open_storage(url)
    assert isinstance(storage, optuna.storages.JournalStorage)
    optuna.create_study(study_name="s", storage=storage)
    assert optuna.get_all_study_names(storage=as_storage(url)) == ["s"]
    assert as_storage("sqlite:///x.db") == "sqlite:///x.db"


def test_one_worker_per_gpu_share_a_journal(tmp_path):
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    journal = tmp_path / "study.log"
    argv = [sys.executable, "-m", "tuner.cli", "tune",
            "--model", str(REPO_ROOT / "models" / "llama-3.2-1b"), "--simulate", "rtx4090",
            "--workload", str(workload), "--trials", str(TRIALS), "--study", "j",
            "--storage", f"journal:{journal}", "--studies-dir", str(tmp_path / "studies"),
            "--sampler", "random", "--time-scale", "25", "--no-export", "--gpus", "0,1"]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            stop_group(proc.pid, grace_s=2.0, child=proc)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    trials = optuna.load_study(study_name="j", storage=as_storage(f"journal:{journal}")).trials
    assert len({t.number for t in trials}) == len(trials)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == TRIALS
    # a worker that finds the budget met by the other ends its run: one placeholder at most
    assert sum(t.state == TrialState.PRUNED for t in trials) <= 2
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    assert len(Counter(t.user_attrs["worker"] for t in trials)) == 2

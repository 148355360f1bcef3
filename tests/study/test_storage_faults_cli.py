"""`tuner tune` against storage faults, end to end: a second worker on a SQLite study, a study
folder whose disk fills up mid-study (a real tmpfs, in a private mount namespace)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.server.process import processes_matching, stop_group
from tuner.paths import REPO_ROOT

ROOT = REPO_ROOT
WORKLOAD = """\
name: storage
seed: 0
warmup: {requests: 1, input_len: 16, output_len: 4}
cells:
  - {concurrency: 4, input_len: 512, output_len: 16, num_prompts: 8}
objectives: ["max output_throughput"]
"""
FILL_AFTER = """
import sqlite3, sys, time
db, ballast = sys.argv[1], sys.argv[2]
def done():
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
    try:
        return con.execute("SELECT COUNT(*) FROM trials WHERE state='COMPLETE'").fetchone()[0]
    finally:
        con.close()
while True:  # until the study holds a completed trial
    try:
        if done():
            break
    except sqlite3.Error:
        pass
    time.sleep(0.2)
with open(ballast, "wb", buffering=0) as f:
    try:
        while True:
            f.write(bytes(4096))
    except OSError:
        pass
"""


def _argv(tmp_path: Path, studies: Path, trials: int) -> list[str]:
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    return [sys.executable, "-m", "tuner.cli", "tune", "--model",
            str(ROOT / "models" / "llama-3.2-1b"), "--simulate", "rtx4090",
            "--workload", str(tmp_path / "w.yaml"), "--trials", str(trials), "--study", "s",
            "--studies-dir", str(studies), "--sampler", "random", "--time-scale", "100",
            "--no-prescreen", "--no-export"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _trials(db: Path) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    try:
        return optuna.load_study(study_name="s", storage=storage).get_trials()
    finally:
        storage.engine.dispose()


def test_two_workers_on_one_sqlite_study_share_it_safely(tmp_path):
    argv = _argv(tmp_path, tmp_path / "studies", 6)
    procs = [subprocess.Popen(argv + ["--seed", str(i)], env=_env(), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True) for i in range(2)]
    try:
        errs = [p.communicate(timeout=120)[1].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                stop_group(p.pid, grace_s=2.0, child=p)
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errs]
    trials = _trials(tmp_path / "studies" / "s" / "study.db")
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 6 and not any(t.state == TrialState.RUNNING for t in trials)
    keys = Counter(t.user_attrs["config_key"] for t in done if "cached_from" not in t.user_attrs)
    assert max(keys.values()) == 1


def _unshare() -> list[str] | None:
    for cmd in (["unshare", "-m"], ["unshare", "-rm"]):
        if not shutil.which("unshare"):
            return None
        if subprocess.run([*cmd, "true"], capture_output=True).returncode == 0:
            return cmd
    return None


@pytest.mark.skipif(_unshare() is None, reason="needs a private mount namespace for a tmpfs")
def test_a_full_disk_exits_3_keeps_the_study_sound_and_resumes(tmp_path):
    studies, saved = tmp_path / "studies", tmp_path / "saved"
    studies.mkdir()
    argv = _argv(tmp_path, studies, 4)
    script = ('mount -t tmpfs -o size=8m tmpfs "$1" || exit 99; shift; '
              '"$PY" -c "$FILL" "$S/s/study.db" "$S/ballast" & "$@"; rc=$?; wait; '
              'rm -f "$S/ballast"; cp -a "$S/." "$SAVED/"; exit $rc')
    env = {**_env(), "PY": sys.executable, "FILL": FILL_AFTER, "S": str(studies),
           "SAVED": str(saved)}
    saved.mkdir()
    run = subprocess.run([*_unshare(), "sh", "-c", script, "sh", str(studies), *argv], env=env,
                         cwd=ROOT, capture_output=True, timeout=180)
    err = run.stderr.decode(errors="replace").strip().splitlines()
    assert run.returncode == 3, err[-20:]
    assert "disk full" in err[-1] and "run the same command to resume" in err[-1]
    assert not processes_matching("tuner.sim", str(tmp_path))
    db = saved / "s" / "study.db"
    with closing(sqlite3.connect(db)) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    before = {t.number: t.values for t in _trials(db) if t.state == TrialState.COMPLETE}
    assert before
    argv[argv.index("--studies-dir") + 1] = str(saved)
    resumed = subprocess.run(argv, env=_env(), cwd=ROOT, capture_output=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr.decode(errors="replace")[-2000:]
    after = _trials(db)
    assert all(t.values == before[t.number] for t in after if t.number in before)
    assert sum(t.state == TrialState.COMPLETE for t in after) == 4
    assert not any(t.state == TrialState.RUNNING for t in after)

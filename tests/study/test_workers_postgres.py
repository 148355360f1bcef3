"""Two workers sharing one study on a real PostgreSQL server (Optuna's RDB storage).

`.ci/run` installs and starts PostgreSQL and sets TUNER_TEST_POSTGRES; without it these tests
are skipped.  Each test uses its own study name and deletes the study afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.server.process import stop_group
from tuner.paths import REPO_ROOT

PG = os.environ.get("TUNER_TEST_POSTGRES")
pytestmark = pytest.mark.skipif(
    not PG, reason="TUNER_TEST_POSTGRES is not set (.ci/run starts PostgreSQL and sets it)")

TRIALS = 8
WORKLOAD = """\
name: pg
seed: 0
warmup: {requests: 1, input_len: 16, output_len: 4}
cells:
  - {concurrency: 4, input_len: 1024, output_len: 64, num_prompts: 16}
objectives: ["max output_throughput"]
"""


@pytest.fixture
def study_name() -> Iterator[str]:
    name = f"pg-workers-{uuid.uuid4().hex[:12]}"
    yield name
    storage = optuna.storages.RDBStorage(PG)
    try:
        optuna.delete_study(study_name=name, storage=storage)
    except KeyError:
        pass
    finally:
        storage.engine.dispose()


def _tune_argv(tmp_path: Path, name: str, *extra: str) -> list[str]:
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    return [sys.executable, "-m", "tuner.cli", "tune", "--model", str(REPO_ROOT / "models" / "llama-3.2-1b"),
            "--simulate", "rtx4090", "--workload", str(workload), "--trials", str(TRIALS),
            "--study", name, "--storage", PG, "--studies-dir", str(tmp_path / "studies"),
            "--sampler", "random", "--time-scale", "25", "--no-export", *extra]


def _run_all(argvs: list[list[str]], timeout_s: float = 50.0) -> list[int]:
    """Start every command at once (each in its own process group) and wait for all."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = []
    try:
        for argv in argvs:
            procs.append(subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, start_new_session=True))
        codes = []
        for p in procs:
            _, err = p.communicate(timeout=timeout_s)
            assert p.returncode == 0, err.decode(errors="replace")[-2000:]
            codes.append(p.returncode)
        return codes
    finally:
        for p in procs:
            if p.poll() is None:
                stop_group(p.pid, grace_s=2.0, child=p)


def _check_shared_study(name: str) -> None:
    storage = optuna.storages.RDBStorage(PG)
    try:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    finally:
        storage.engine.dispose()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)), f"duplicate trial numbers: {sorted(numbers)}"
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == TRIALS
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    workers = Counter(t.user_attrs["worker"] for t in complete)
    assert len(workers) == 2, f"trials by worker: {dict(workers)}"


def test_two_workers_on_two_hosts_share_one_study(tmp_path, study_name):
    """Two independent `tuner tune` commands, as on two machines (each its own --seed)."""
    _run_all([_tune_argv(tmp_path, study_name, "--seed", str(seed)) for seed in (1, 2)])
    _check_shared_study(study_name)


def test_one_worker_per_gpu_shares_one_study(tmp_path, study_name):
    """`--gpus 0,1`: one command starts a worker per GPU, both on the same storage."""
    _run_all([_tune_argv(tmp_path, study_name, "--gpus", "0,1")])
    _check_shared_study(study_name)

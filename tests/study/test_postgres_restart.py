"""PostgreSQL restarted under a running study: the tuner waits it out and loses nothing.

A throwaway cluster of its own (initdb in a temp dir, a free port, run as the `postgres` user),
so the restart disturbs no other test.  Skipped where PostgreSQL's binaries or that user are
missing (`.ci/run` installs them).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.server.process import free_port, processes_matching, stop_group
from tuner.paths import REPO_ROOT

ROOT = REPO_ROOT
BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
WORKLOAD = """\
name: pg
seed: 0
warmup: {requests: 1, input_len: 16, output_len: 4}
cells:
  - {concurrency: 4, input_len: 512, output_len: 16, num_prompts: 8}
objectives: ["max output_throughput"]
"""


def _postgres_user() -> bool:
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return os.geteuid() == 0


pytestmark = pytest.mark.skipif(not BIN or not _postgres_user(),
                                reason="needs PostgreSQL's binaries, run as root")


def _pg(data: Path, *args: str) -> None:
    pg_ctl = str(Path(BIN[-1]).parent / "pg_ctl")
    subprocess.run(["su", "postgres", "-c", " ".join([pg_ctl, "-D", str(data), *args])],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture
def cluster() -> Iterator[tuple[str, Path]]:
    home = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    shutil.chown(home, "postgres")
    data, port = home / "data", free_port()
    subprocess.run(["su", "postgres", "-c", f"{BIN[-1]} -D {data} -A trust -U postgres"],
                   check=True, capture_output=True, timeout=120)
    opts = f"'-p {port} -k {home} -c listen_addresses=127.0.0.1'"
    _pg(data, "-o", opts, "-l", str(home / "log"), "-w", "start")
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres", data
    finally:
        _pg(data, "-m", "immediate", "stop")
        shutil.rmtree(home, ignore_errors=True)


def _complete(url: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name="s", storage=storage).get_trials(
            states=(TrialState.COMPLETE,))
    except KeyError:
        return []
    finally:
        storage.engine.dispose()


def test_a_postgresql_restart_mid_study_is_waited_out(cluster, tmp_path):
    url, data = cluster
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    argv = [sys.executable, "-m", "tuner.cli", "tune", "--model",
            str(ROOT / "models" / "llama-3.2-1b"), "--simulate", "rtx4090",
            "--workload", str(tmp_path / "w.yaml"), "--trials", "6", "--study", "s",
            "--storage", url, "--studies-dir", str(tmp_path / "studies"), "--sampler", "random",
            "--time-scale", "100", "--no-prescreen", "--no-export"]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(before := _complete(url)) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        # every connection is terminated; the options of the first start are kept
        _pg(data, "-m", "fast", "-l", str(data.parent / "log"), "-w", "restart")
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            stop_group(proc.pid, grace_s=2.0, child=proc)
    text = err.decode(errors="replace")
    assert proc.returncode == 0, text[-2000:]
    after = {t.number: t.values for t in _complete(url)}
    assert 2 <= len(before) < 6, "the restart did not land mid-study"
    assert len(after) == 6 and all(after[t.number] == t.values for t in before)
    assert not processes_matching("tuner.sim", str(tmp_path))

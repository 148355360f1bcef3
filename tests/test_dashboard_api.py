"""optuna-dashboard reads a finished simulated study correctly: metric names and feasibility.

Started as a real process on 127.0.0.1 and read through its JSON API, as the browser does.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "models" / "llama-3.1-8b")
_DASHBOARD = "import sys; from optuna_dashboard._cli import main; sys.exit(main())"  # its CLI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, proc: subprocess.Popen, deadline: float) -> dict:
    while True:
        try:
            return json.loads(urllib.request.urlopen(url, timeout=10).read())
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)


@pytest.mark.timeout(180)
def test_dashboard_api_shows_metric_names_and_marks_infeasible_trials(tmp_path):
    studies = tmp_path / "studies"
    assert main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--time-scale", "50",
                 "--trials", "6", "--study", "dash", "--studies-dir", str(studies),
                 "--sampler", "random", "--seed", "3"]) == 0
    db = studies / "dash" / "study.db"
    stored = {t.number: t for t in optuna.load_study(
        study_name="dash", storage=f"sqlite:///{db}").get_trials()}
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _DASHBOARD, f"sqlite:///{db}",
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        base = f"http://127.0.0.1:{port}/api/studies"
        study_id = _get(base, proc, deadline)["study_summaries"][0]["study_id"]
        detail = _get(f"{base}/{study_id}", proc, deadline)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert detail["objective_names"] == [
        "output_throughput (tok/s)", "p99_ttft_ms (ms)", "p99_tpot_ms (ms)"]
    assert len(detail["trials"]) == 6
    outcomes = {t.user_attrs["outcome"] for t in stored.values()}
    assert "ok" in outcomes and outcomes - {"ok"}, outcomes  # seed 3: both kinds occur
    for t in detail["trials"]:
        frozen = stored[t["number"]]
        feasible = frozen.user_attrs["outcome"] == "ok"
        assert t["constraints"], t
        assert t["constraints"][0] == (0.0 if feasible else 1.0)
        assert all(c <= 0 for c in t["constraints"]) == feasible
        assert not any(k.isdigit() for k in frozen.user_attrs)

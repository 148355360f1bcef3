"""End to end on the simulated InfiniLM server: real processes on loopback, real CLI."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner.bench.records import Cell
from tuner.cli import main
from tuner.server.process import port_is_free, processes_matching
from tuner.search.space_file import load_space
from tuner.trial.context import TrialContext
from tuner.trial.run import run_trial
from tuner.search.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "llama-3.1-8b")
SPACE = ROOT / "search_spaces" / "infinilm.yaml"
QUICK = ROOT / "studies" / "quick.yaml"


def _sim_processes(marker: str) -> list[int]:
    """Pids of live simulated servers whose command line mentions `marker`."""
    return processes_matching("tuner.sim", marker)


def _ports(trials_dir: Path) -> list[int]:
    return [json.loads(p.read_text())["port"] for p in trials_dir.glob("*/server.json")]


def test_oom_under_load_is_classified_oom_and_the_server_is_gone(tmp_path):
    # 96 x 256 blocks on the 4090: starts fine, the first 4096-token prefill overflows (the seed).
    ctx = TrialContext(space=load_space(SPACE), workload=load_workload(QUICK), model_dir=MODEL,
                       simulate="rtx4090", time_scale=50.0, stall_timeout_s=60.0)
    params = {"kv_cache_tokens": 96 * 256, "block_size": 256, "max_batch_size": 8}
    res = run_trial(ctx, params, tmp_path / "t0", cells=[Cell(1, 4096, 16, num_prompts=1)])
    log = (tmp_path / "t0" / "server.log").read_text()
    assert "cudaMalloc failed" in log and "Error in step loop" in log
    assert res.outcome.kind == "oom" and "under load" in res.outcome.reason
    port = json.loads((tmp_path / "t0" / "server.json").read_text())["port"]
    assert port_is_free(port) and not _sim_processes(str(port))


def test_tune_export_inspect_on_the_simulator(tmp_path, capsys):
    studies = tmp_path / "studies"
    assert main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--trials", "4", "--study", "e2e",
                 "--studies-dir", str(studies), "--sampler", "random", "--seed", "3"]) == 0
    folder = studies / "e2e"
    assert (folder / "report.html").stat().st_size > 100_000
    study = optuna.load_study(study_name="e2e", storage=f"sqlite:///{folder / 'study.db'}")
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    for t in trials:
        assert t.constraints["feasible"] == (0.0 if t.user_attrs["outcome"] == "ok" else 1.0)
    banner = capsys.readouterr().out   # the resolved KV range and the workload's peak demand
    assert re.search(r"kv_cache_tokens: \[\d+, \d+\] for this model on a 24\.0 GiB card "
                     r"\(high: auto\), .*the heaviest cell holds \d+ tokens at once", banner)
    assert main(["inspect", "--study", "e2e", "--studies-dir", str(studies), "--format", "json",
                 "--no-report"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["number"] for t in doc["trials"]] == [0, 1, 2, 3]
    assert {"number", "params", "outcome", "values", "constraints"} <= set(doc["trials"][0])
    assert "pareto" in doc
    assert any(t.user_attrs["outcome"] == "ok" for t in trials)
    assert (folder / "best.env").is_file()
    # the budget is spent: resumed with --confirm-pick, only the pick runs again
    assert main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--trials", "4", "--study",
                 "e2e", "--studies-dir", str(studies), "--confirm-pick", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"trial \d confirmed as trial 4 over 2 runs .*: holds", out), out
    assert "(trial 4)" in out                        # best.env is written from the confirmation
    for port in _ports(folder / "trials"):
        assert port_is_free(port) and not _sim_processes(f"--port {port}")


@pytest.mark.timeout(120)
def test_ctrl_c_mid_trial_leaves_no_server_and_frees_the_port(tmp_path):
    studies = tmp_path / "studies"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "tune", "--model", MODEL, "--simulate", "rtx4090",
         "--time-scale", "2", "--trials", "3", "--study", "cc", "--studies-dir", str(studies),
         "--sampler", "random"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((studies / "cc" / "trials").glob("*/server.json")):
            time.sleep(0.1)
        time.sleep(1.0)  # the server is up and serving
        port = _ports(studies / "cc" / "trials")[0]
        assert _sim_processes(f"--port {port}"), "no simulated server started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    # the interrupted trial's one line starts a line of its own, not the progress bar's
    assert any(re.match(rb"\[W [^]]*\] Trial \d+ interrupted: not counted", line)
               for line in re.split(rb"[\r\n]", err)), err.decode()[-2000:]
    assert b"Traceback" not in err and b"failed with value" not in err, err.decode()[-2000:]
    for port in _ports(studies / "cc" / "trials"):
        assert port_is_free(port) and not _sim_processes(f"--port {port}")


def test_ablate_on_the_simulator_finds_the_knob_it_ignores(tmp_path, capsys):
    """A misspelt variable (the simulator, like InfiniLM, reads INFINILM_PREFILL_BATCH_CAP) is
    found dead, max_batch_size alive; the verdicts reach the study and best.env."""
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.read_text().replace("\nparameters:\n", "\nparameters:\n  typo_cap:\n"
                     "    {type: int, low: 1, high: 64, env: INFINILM_PREFIL_BATCH_CAP}\n", 1))
    studies = tmp_path / "studies"
    common = ["--model", MODEL, "--simulate", "rtx4090", "--time-scale", "50", "--space", str(space),
              "--studies-dir", str(studies), "--study", "ab"]
    # the base: a config whose max batch binds (phase caps above it), not a random draw that
    # may cap decode at 1 and so leave max_batch_size nothing to do
    base = tmp_path / "base.yaml"
    base.write_text("kv_cache_tokens: 16384\nblock_size: 256\nmax_batch_size: 8\n"
                    "prefill_batch_cap: 8\ndecode_batch_cap: 8\nenable_graph: true\n"
                    "max_num_batched_tokens: 8192\nlong_context_threshold: 4096\n"
                    "long_context_max_batch: 1\nlong_context_use_total_len: false\n"
                    "decode_first_when_running: true\ntypo_cap: 1\n")
    assert main(["tune", *common, "--trials", "1", "--sampler", "random", "--seed", "1",
                 "--no-defaults", "--seed-config", str(base), "--no-export"]) == 0
    out = tmp_path / "ablation.json"
    # a 10% floor: at 50x simulated time, wall-clock jitter moves a p99 of 4 requests by a few %
    assert main(["ablate", *common, "--trial", "0", "--knobs", "max_batch_size,typo_cap",
                 "--per-knob", "1", "--floor", "0.1", "-o", str(out)]) == 0
    verdicts = json.loads(out.read_text())["verdicts"]
    assert verdicts == {"max_batch_size": "effect", "typo_cap": "no effect"}
    study = optuna.load_study(study_name="ab", storage=f"sqlite:///{studies / 'ab' / 'study.db'}")
    assert study.user_attrs["ablation"]["verdicts"] == verdicts
    assert main(["export", "--studies-dir", str(studies), "--study", "ab"]) == 0
    assert "no effect on this server, within the noise: INFINILM_PREFIL_BATCH_CAP" in \
        (studies / "ab" / "best.env").read_text()
    capsys.readouterr()

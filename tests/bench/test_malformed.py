"""Broken streams fail their requests, their cell and their trial, and are never exported.

tests/malformed_server.py runs as a real process on 127.0.0.1 and breaks the protocol in one way
per kind; every broken kind streams faster than the good one, as issue 20's server did.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import requests

from tuner.bench.records import Cell
from tuner.bench.runner import run_cells
from tuner.cli import main

HERE = Path(__file__).resolve().parents[1]
SERVER = HERE / "malformed_server.py"
MODEL = str(HERE.parent / "models" / "llama-3.2-1b")
# kind -> (record error class, words of its reason)
BROKEN = {
    "truncated_json": ("protocol", "event is not JSON"),
    "non_json": ("protocol", "event is not JSON: tok"),
    "no_data_prefix": ("protocol", "line is no SSE field"),
    "no_done": ("protocol", "without [DONE] or a finish_reason"),
    "usage_inflated": ("protocol", "more than max_tokens 8"),
    "usage_short": ("protocol", "usage reports 7 completion tokens, 8 token chunks"),
    "after_done": ("protocol", "event after [DONE]"),
    "error_event": ("stream_error", "engine died"),
    "not_sse": ("protocol", "Content-Type 'application/json'"),
    "cut": ("protocol", "connection closed mid-stream"),
    "empty_choices": ("protocol", "chunk without choices"),
    "bad_utf8": ("protocol", "invalid UTF-8"),
    "issue20": ("protocol", "event is not JSON"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port)],
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                requests.get(url + "/health", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
                time.sleep(0.05)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def run_kind(url: str, kind: str):
    """One cell of `kind`.  (Cells like these hung now and then until tuner.aio: a broken stream
    kicked the health watch as the cell cancelled it, and Python 3.11's wait_for swallowed the
    cancellation; tests/test_aio.py pins that.)"""
    return run_cells(url, [Cell(concurrency=2, input_len=4, output_len=8, num_prompts=4)],
                     model_name=kind, health_url=url + "/health", stall_timeout_s=5)[0]


def test_the_good_stream_is_measured(server):
    res = run_kind(server, "good")
    assert res.error_class is None and res.metrics["completed"] == 4
    assert res.metrics["total_output_tokens"] == 32


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_each_broken_stream_fails_its_requests_with_the_reason(server, kind):
    error_class, reason = BROKEN[kind]
    res = run_kind(server, kind)
    assert res.error_class == "protocol" and reason in res.error
    assert res.metrics["failed"] == 4 and res.metrics["completed"] == 0
    assert res.metrics["total_output_tokens"] == 0
    for rec in res.records:
        assert rec.error_class == error_class and reason in rec.error, rec.error


SPACE = """name: malformed
description: a server whose streams break the protocol (tests/malformed_server.py)
server:
  command: ["{python}", "%s", "--port", "{port}", "--model", "{model}"]
  health_path: /health
  startup_timeout_s: 20
  api: chat
fixed_flags: []
parameters:
  kind: {type: categorical, choices: [%s], flag: --kind, default: good}
"""
WORKLOAD = """name: tiny
seed: 0
cells:
  - {concurrency: 2, input_len: 4, output_len: 8, num_prompts: 4}
objectives: ["max output_throughput", "min p99_ttft_ms"]
"""


def test_tune_records_broken_servers_infeasible_and_export_never_picks_one(tmp_path, capsys):
    kinds = ["good", "issue20", "truncated_json", "usage_inflated", "no_done"]
    space, workload, studies = tmp_path / "space.yaml", tmp_path / "w.yaml", tmp_path / "studies"
    space.write_text(SPACE % (SERVER, ", ".join(kinds)))
    workload.write_text(WORKLOAD)
    common = ["--studies-dir", str(studies), "--study", "m"]
    assert main(["tune", "--model", MODEL, "--space", str(space), "--workload", str(workload),
                 "--trials", "6", "--sampler", "random", "--seed", "4", "--gpu-memory", "24GiB",
                 "--no-prescreen", *common]) == 0
    study = optuna.load_study(study_name="m", storage=f"sqlite:///{studies / 'm' / 'study.db'}")
    seen = {t.params["kind"]: t for t in study.get_trials() if "cached_from" not in t.user_attrs}
    assert set(seen) == set(kinds)  # seed 4 visits every kind in 6 trials
    for kind, t in seen.items():
        assert t.user_attrs["outcome"] == ("ok" if kind == "good" else "protocol"), kind
        assert t.constraints["feasible"] == (0.0 if kind == "good" else 1.0)
    for pick in ("knee", "max-throughput", "min-ttft"):
        out = tmp_path / f"{pick}.json"
        assert main(["export", *common, "--pick", pick, "--format", "json", "-o", str(out)]) == 0
        assert '"kind": "good"' in out.read_text()
    for kind in kinds[1:]:
        assert main(["export", *common, "--trial", str(seen[kind].number)]) == 2
        assert "not feasible (outcome protocol)" in capsys.readouterr().err

"""`tuner bench --dataset/--trace/--capacity` and `tuner tune` on source workloads, through the
real command line: bad lines refused before anything is sent or written, and an end-to-end run
against the simulated server as a process on loopback."""

from __future__ import annotations

import json

import yaml

from tests.sim.test_server import free_port, start, stop, wait_health
from tuner.cli import main
from tuner.paths import REPO_ROOT

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")


def _one_error_line(capsys, command: str, needle: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tuner {command}: error: "), err
    assert needle in err[0], err[0]


def test_bench_bad_trace_line_exit_2_nothing_written(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 4, "output_length": 2}\n'
                     '{"timestamp": 10, "input_length": "four", "output_length": 2}\n')
    out = tmp_path / "out" / "res.json"
    rc = main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--trace", str(trace),
               "-o", str(out), "--no-progress"])
    assert rc == 2
    _one_error_line(capsys, "bench", f"{trace}:2: input_length")
    assert not (tmp_path / "out").exists()


def test_bench_bad_dataset_entry_exit_2(tmp_path, capsys):
    data = tmp_path / "d.json"
    data.write_text('[\n  {"conversations": [{"from": "human", "value": "hi there you all"}]},\n'
                    '  {"conversations": "oops"}\n]\n')
    rc = main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--dataset", str(data),
               "--concurrency", "2", "-o", str(tmp_path / "r.json")])
    assert rc == 2
    _one_error_line(capsys, "bench", f"{data}:3: entry needs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json"]


def test_tune_workload_with_bad_dataset_line_creates_no_study(tmp_path, capsys):
    data = tmp_path / "r.jsonl"
    data.write_text('{"input_len": 4, "output_len": 2}\n{"input_len": 4}\n')
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({"cells": [{"source": {"dataset": {"path": "r.jsonl"}},
                                             "concurrency": 2}]}))
    studies = tmp_path / "studies"
    studies.mkdir()
    rc = main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--trials", "1",
               "--workload", str(wl), "--studies-dir", str(studies), "--no-export"])
    assert rc == 2
    _one_error_line(capsys, "tune", f"{data}:2: output_len")
    assert list(studies.iterdir()) == []


def test_trace_replay_and_capacity_against_the_simulator(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 250 * i, "input_length": 40 + i,
                                         "output_length": 8}) + "\n" for i in range(12)))
    wl = tmp_path / "cap.yaml"
    wl.write_text(yaml.safe_dump({
        "warmup": None,
        "cells": [{"source": {"shared_prefix": {"groups": 2, "prefix_len": 256, "suffix_len": 16,
                                                "turns": 2, "output_len": 16}},
                   "concurrency": 8, "request_rate": 1}],
        "slo": {"p99_ttft_ms": 400, "p99_tpot_ms": 60},
        "capacity": {"min_rate": 1, "max_rate": 64, "resolution": 0.5, "step_requests": 24}}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--port", str(port), "--time-scale", "50", "--num-blocks", "64",
                  "--block-size", "64", "--max-batch-size", "16"], tmp_path / "server.log")
    try:
        wait_health(url, proc)
        out = tmp_path / "trace.json"
        assert main(["bench", "--url", url, "--model", "m", "--trace", str(trace), "-o", str(out),
                     "--no-progress"]) == 0
        [row] = json.loads(out.read_text())
        assert row["source"] == "trace" and row["completed"] == 12 and row["failed"] == 0
        assert row["total_input_tokens"] == sum(40 + i + 36 for i in range(12))  # + template
        # the trace's 2.75 s of arrivals in simulated time; the client's wall-clock send error is
        # multiplied by the time scale (50), so a loaded machine shifts it by a few tenths
        assert 2.4 <= row["duration"] < 3.6
        capsys.readouterr()
        assert main(["bench", "--url", url, "--model", "m", "--workload", str(wl), "--capacity",
                     "-o", str(tmp_path / "cap.json"), "--no-progress"]) == 0
        printed = capsys.readouterr().out
        assert "capacity: " in printed and "capacity step: rate=1.0 passed=True" in printed
        cap = json.loads((tmp_path / "cap.capacity.json").read_text())
        assert cap["capacity_rps"] >= 1 and len(cap["steps"]) >= 2
    finally:
        stop(proc)


def test_capacity_objective_without_a_capacity_section_is_refused(tmp_path, capsys):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({"cells": [{"concurrency": 1, "input_len": 8, "output_len": 4}],
                                  "objectives": ["max capacity_rps"]}))
    studies = tmp_path / "studies"
    studies.mkdir()
    rc = main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--trials", "1",
               "--workload", str(wl), "--studies-dir", str(studies), "--no-export"])
    assert rc == 2
    _one_error_line(capsys, "tune", "capacity_rps needs a capacity: section")
    assert list(studies.iterdir()) == []

"""`tuner inspect`: trials, Pareto set and pick as table or JSON; --serve runs optuna-dashboard."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from tests.fakestudy import make_study_dir, run_cli
from tuner.commands import inspect as inspect_cmd

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def studies(tmp_path):
    make_study_dir(tmp_path / "studies")
    return tmp_path / "studies"


def test_json_lists_every_trial_and_the_pareto_set(studies, capsys):
    assert run_cli(["inspect", "--studies-dir", str(studies), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    assert [t["number"] for t in doc["trials"]] == [t.number for t in study.trials]
    for rec, trial in zip(doc["trials"], study.trials):
        assert {"number", "params", "outcome", "values", "constraints"} <= set(rec)
        assert rec["params"] == trial.params
        # a failed trial's worst-case stand-ins are for the sampler, not a measurement
        measured = trial.user_attrs["outcome"] in ("ok", "slo")
        assert rec["values"] == (trial.values if measured else None)
        assert rec["constraints"] == trial.constraints and rec["outcome"] == trial.user_attrs["outcome"]
    assert doc["pareto"] == sorted(t.number for t in study.best_trials)
    assert doc["chosen"] in doc["pareto"]
    assert doc["objectives"] == ["max output_throughput", "min p99_ttft_ms", "min p99_tpot_ms"]
    assert Path(doc["report"]).is_file()


def test_table_marks_pareto_and_pick(studies, capsys):
    assert run_cli(["inspect", "--studies-dir", str(studies), "--no-report", "--pick", "max-throughput"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:8] == ["#", "outcome", "output_throughput", "(tok/s)", "p99_ttft_ms",
                                    "(ms)", "p99_tpot_ms", "(ms)"]
    assert any(line.startswith(">*") for line in lines)
    assert "Pareto set (feasible):" in out and "chosen: trial" in out and "max-throughput" in out
    assert "oom" in out and "crash" in out
    assert not (studies / "demo" / "report.html").exists()


def test_inspect_works_when_nothing_is_feasible(tmp_path, capsys):
    make_study_dir(tmp_path / "studies", n_ok=0, n_fail=2, all_fail=True)
    assert run_cli(["inspect", "--studies-dir", str(tmp_path / "studies"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pareto"] == [] and doc["chosen"] is None
    assert "No feasible trial" in (tmp_path / "studies" / "demo" / "report.html").read_text()


def test_serve_binds_loopback_by_default(studies, monkeypatch):
    seen = {}

    def fake_run_server(storage, host, port):
        seen.update(storage=storage, host=host, port=port)  # and the server ends

    monkeypatch.setattr("optuna_dashboard.run_server", fake_run_server)
    assert run_cli(["inspect", "--studies-dir", str(studies), "--serve"]) == 0
    assert seen == {"storage": f"sqlite:///{studies / 'demo' / 'study.db'}", "host": "127.0.0.1", "port": 8080}


def test_serve_on_a_busy_port_is_a_clear_error(studies, monkeypatch, capsys):
    def busy(storage, host, port):
        raise OSError(98, "Address already in use")

    monkeypatch.setattr("optuna_dashboard.run_server", busy)
    assert run_cli(["inspect", "--studies-dir", str(studies), "--serve", "--port", "8099"]) == 2
    assert "cannot serve on 127.0.0.1:8099" in capsys.readouterr().err


def test_serve_without_dashboard_is_a_clear_error(studies, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)
    assert run_cli(["inspect", "--studies-dir", str(studies), "--serve"]) == 2
    assert "pip install" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_runs_in_the_foreground_until_ctrl_c_and_shows_the_figures(studies):
    assert run_cli(["inspect", "--studies-dir", str(studies)]) == 0  # stores the figures
    port = _free_port()
    code = ("import sys; from tests.fakestudy import run_cli; "
            f"sys.exit(run_cli(['inspect', '--studies-dir', {str(studies)!r}, '--serve', '--port', '{port}']))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body = b""
        deadline = time.monotonic() + 90  # generous: a loaded CI box imports slowly
        while not body and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10).read()
            except OSError:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.2)
        assert b"demo" in body
        study_id = json.loads(body)["study_summaries"][0]["study_id"]
        detail = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study_id}", timeout=30).read())
        ids = {g["id"] for g in detail["plotly_graph_objects"]}
        assert {"tuner-pareto", "tuner-failures", "tuner-cells"} <= ids
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_records_say_inf_and_nan_as_strings():
    assert inspect_cmd._finite(float("inf")) == "inf" and inspect_cmd._finite(1.5) == 1.5


def _table_rows(out: str) -> list[list[str]]:
    """The table's rows as tokens, marks (> chosen, * Pareto) dropped: [number, outcome, ...]."""
    rows = []
    for line in out.split("\n\n")[0].splitlines()[1:]:
        tokens = line.split()
        rows.append(tokens[1:] if tokens[0] in (">", "*", ">*") else tokens)
    return rows


def test_default_table_is_narrow_and_wide_has_every_column(studies, capsys):
    assert run_cli(["inspect", "--studies-dir", str(studies), "--no-report"]) == 0
    narrow = capsys.readouterr().out
    assert run_cli(["inspect", "--studies-dir", str(studies), "--no-report", "--wide"]) == 0
    wide = capsys.readouterr().out
    table = narrow.split("\n\n")[0]
    assert max(len(line) for line in table.splitlines()) <= 160
    assert "num_blocks" not in table and "num_blocks" in wide and "feasible" in wide
    # failures show '-', never the worst-case stand-ins (0 tok/s, 1e9 ms) the sampler holds
    for row in _table_rows(narrow):
        if row[1] in ("oom", "crash"):
            assert row[2:6] == ["-", "-", "-", "-"]
    assert "1,000,000,000" not in narrow and "1e+09" not in wide
    assert "'-': not measured" in narrow


def test_vs_default_blank_is_explained(tmp_path, capsys):
    make_study_dir(tmp_path / "studies", default_outcome="skipped")
    assert run_cli(["inspect", "--studies-dir", str(tmp_path / "studies"), "--no-report"]) == 0
    out = capsys.readouterr().out
    head = "the default config (trial 0) was skipped by the memory pre-screen"
    assert f"vs default: '-' throughout: {head}" in out   # the table's footnote
    assert f"vs default: none, {head}" in out               # the result block
    assert not any(cell.endswith("x") and cell[0].isdigit() for row in _table_rows(out) for cell in row)


def test_vs_default_ratio_when_the_default_ran(tmp_path, capsys):
    study = make_study_dir(tmp_path / "studies")
    default = study.trials[0]
    assert default.user_attrs["is_default"] and default.user_attrs["outcome"] == "ok"
    assert run_cli(["inspect", "--studies-dir", str(tmp_path / "studies"), "--no-report"]) == 0
    out = capsys.readouterr().out
    rows = {int(r[0]): r for r in _table_rows(out) if r[0].isdigit()}
    for t in study.trials[1:]:
        if t.user_attrs["outcome"] in ("ok", "slo"):
            assert f"{t.values[0] / default.values[0]:.2f}x" in rows[t.number]
    assert f"vs default (trial {default.number}): output_throughput" in out


def test_dashboard_hint_is_said_once_per_study(studies, monkeypatch, capsys):
    from tuner.output import report
    monkeypatch.setattr(report, "store_in_dashboard", lambda study, figs: False)
    for _ in range(2):
        assert run_cli(["inspect", "--studies-dir", str(studies), "--format", "json"]) == 0
    assert capsys.readouterr().err.count("optuna-dashboard not installed") == 1

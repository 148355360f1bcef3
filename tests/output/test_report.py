"""report.html: self-contained, renders every figure in headless Chromium without JS errors."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path

import optuna
import pytest

from tests.fakestudy import make_study, make_study_dir, run_cli
from tuner.output import report
from tuner.output.select import choose

optuna.logging.set_verbosity(optuna.logging.WARNING)
CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason=f"{CHROMIUM} absent (Debian package 'chromium'; CI installs it)")


def chromium(page: Path, tmp: Path, *extra: str) -> str:
    """Run headless Chromium on file://page offline; returns stdout (the DOM with --dump-dom)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=15000", *extra, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def body_attrs(dom: str) -> dict[str, str]:
    tag = re.search(r"<body([^>]*)>", dom).group(1)
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag)}


@pytest.fixture
def studies(tmp_path):
    make_study_dir(tmp_path / "studies")
    return tmp_path / "studies"


def test_report_is_self_contained(studies):
    assert run_cli(["inspect", "--studies-dir", str(studies), "--no-report"]) == 0
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    path = studies / "demo" / "report.html"
    figs = report.write_report(path, study, choose(study))
    text = path.read_text()
    assert set(figs) == {"pareto", "importances", "history", "failures", "cells", "memory"}
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # nothing loaded from elsewhere
    assert "Plotly.newPlot" in text and len(text) > 1_000_000  # plotly.js inlined
    assert "id='memory-note'" not in text


def test_memory_not_recorded_is_said(tmp_path):
    study = make_study()
    trials = study.trials
    for t in trials:
        t.user_attrs.pop("predicted_peak_bytes")
    bare = optuna.create_study(directions=study.directions)
    bare.set_user_attr("objectives", study.user_attrs["objectives"])
    bare.add_trials(trials)
    figs = report.write_report(tmp_path / "r.html", bare, choose(bare))
    assert "memory" not in figs
    assert "id='memory-note'><h3>Memory headroom: predicted vs seen</h3><p>not recorded" in (tmp_path / "r.html").read_text()


def test_figures_are_stored_for_optuna_dashboard(studies):
    assert run_cli(["inspect", "--studies-dir", str(studies)]) == 0
    storage = optuna.storages.RDBStorage(f"sqlite:///{studies / 'demo' / 'study.db'}")
    keys = " ".join(storage.get_study_system_attrs(storage.get_study_id_from_name("demo")))
    for fid in ("pareto", "importances", "history", "failures", "cells", "memory"):
        assert f"tuner-{fid}" in keys


def test_default_config_is_beside_the_chosen_one(studies):
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    figs = report.build_figures(study, choose(study))
    table = figs["cells"].data[0]
    assert any("default #0" in h for h in table.header.values)
    assert list(table.cells.values[0]) == ["c4_i4096_o64", "c64_i256_o256"]


@needs_chromium
def test_report_renders_in_headless_chromium(studies, tmp_path):
    assert run_cli(["inspect", "--studies-dir", str(studies)]) == 0
    page = studies / "demo" / "report.html"
    dom = chromium(page, tmp_path, "--dump-dom")
    attrs = body_attrs(dom)
    assert "data-js-errors" not in attrs, attrs.get("data-js-errors")
    ids = json.loads(re.search(r"var ids=(\[[^\]]*\])", page.read_text()).group(1))
    assert attrs.get("data-figures") == str(len(ids)) == "6"
    for fid in ids:
        assert re.search(rf"<div id=\"{fid}\" class=\"[^\"]*js-plotly-plot", dom), fid
    shot = Path(os.environ.get("TUNER_SCREENSHOT_DIR", tmp_path)) / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    chromium(page, tmp_path, "--window-size=1400,3600", f"--screenshot={shot}")
    assert shot.stat().st_size > 50_000


@needs_chromium
def test_harness_catches_js_errors(studies, tmp_path):
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{studies / 'demo' / 'study.db'}")
    page = tmp_path / "broken.html"
    text = report.render_html(study, choose(study), report.build_figures(study, choose(study)))
    page.write_text(text.replace("Plotly.newPlot(id,", "Plotly.noSuchFunction(id,", 1))
    attrs = body_attrs(chromium(page, tmp_path, "--dump-dom"))
    assert "noSuchFunction" in attrs.get("data-js-errors", "") and "data-figures" not in attrs

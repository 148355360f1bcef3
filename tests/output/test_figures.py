"""report.html's figures: units on every axis, no stand-in values drawn, counts visible."""

from __future__ import annotations

import optuna
import pytest

from tests.fakestudy import make_study
from tuner.output import report
from tuner.output.scatter_figures import failure_map, pareto_front
from tuner.output.select import choose, study_objectives
from tuner.study.record import records

optuna.logging.set_verbosity(optuna.logging.WARNING)
UNITS = ("(tok/s)", "(ms)", "(req/s)", "%", "trial", "share of variance")


@pytest.fixture(scope="module")
def study():
    return make_study(n_ok=10, n_fail=6, seed=5)


def _axes(fig):
    layout = fig.to_plotly_json()["layout"]
    return {k: v for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))}


def test_every_titled_axis_has_a_unit(study):
    figs = report.build_figures(study, choose(study))
    for fid in ("pareto", "history", "importances"):
        for name, axis in _axes(figs[fid]).items():
            title = (axis.get("title") or {}).get("text")
            assert title, f"{fid}.{name} has no title"
            assert any(u in title for u in UNITS), f"{fid}.{name}: {title!r} names no unit"


def test_pareto_draws_only_measured_values_and_counts_the_rest(study):
    trials = records(study)
    objectives = study_objectives(study)
    fig = pareto_front(trials, objectives, [], None)
    drawn = [y for trace in fig.data for y in (trace.y or ()) if y is not None]
    assert drawn and 1e9 not in drawn and max(drawn) < 1e6     # no worst-case stand-ins
    failed = [t for t in trials if not t.measured]
    names = [trace.name for trace in fig.data]
    for outcome in {t.outcome for t in failed}:
        n = sum(t.outcome == outcome for t in failed)
        assert any(name.startswith(f"{outcome}: {n} trial") for name in names), names
    assert f"{sum(t.outcome == 'oom' for t in failed)} oom" in fig.layout.title.text


def test_failure_map_counts_trials_that_share_a_marker(study):
    trials = records(study)
    fig = failure_map(trials)
    oom = [t for t in trials if t.outcome == "oom"]
    assert len(oom) >= 2 and len({t.params["block_size"] for t in oom}) == 1   # they overlap
    trace = next(tr for tr in fig.data if tr.name == "oom" and tr.xaxis == "x")  # block_size
    assert list(trace.x) == [256] and list(trace.text) == [str(len(oom))]
    total = sum(int(tx or 1) for tr in fig.data if tr.xaxis == "x" for tx in tr.text)
    assert total == sum("block_size" in t.params for t in trials)

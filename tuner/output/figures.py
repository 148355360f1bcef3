"""The plotly figures of report.html (and of optuna-dashboard), one function per figure.

Failed trials carry worst-case objective values, which would squash every axis; figures that
plot objectives therefore draw failures at the worst edge of the range the ok trials span, with
an x marker and a hover that says the value was not measured.
"""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.subplots import make_subplots

from tuner.output.knob_check import MIN_TRIALS, KnobReport
from tuner.search.objectives import Objective
from tuner.search.slo import cell_id
from tuner.study.record import TrialRecord, is_measured

OUTCOME_COLORS = {
    "ok": "#2ca02c",
    "slo": "#bcbd22",
    "oom": "#d62728",
    "crash": "#000000",
    "unhealthy": "#ff7f0e",
    "hang": "#9467bd",
    "startup": "#8c564b",
    "skipped": "#7f7f7f",
    "rejected": "#e377c2",
    "interrupted": "#aec7e8",
    "flaky": "#ffbb78",
    "gpu_busy": "#c7c7c7",
}
CELL_METRICS = ("output_throughput", "p99_ttft_ms", "p99_tpot_ms", "mean_ttft_ms", "mean_tpot_ms")


def _color(name: str) -> str:
    return OUTCOME_COLORS.get(name, "#17becf")


def _axis_values(trials: Sequence[TrialRecord], i: int, obj: Objective) -> list[float]:
    """Objective i per trial; unmeasured trials placed 5% beyond the worst measured value."""
    seen = [t.values[i] for t in trials if t.measured and t.values] or [0.0, 1.0]
    lo, hi = min(seen), max(seen)
    pad = 0.05 * ((hi - lo) or abs(hi) or 1.0)
    edge = lo - pad if obj.maximize else hi + pad
    return [t.values[i] if t.measured and t.values else edge for t in trials]


def _hover(t: TrialRecord, objectives: Sequence[Objective]) -> str:
    head = f"trial {t.number}: {t.outcome}"
    if not t.measured or t.values is None:
        reason = t.reason[:120]
        return f"{head}<br>not measured (worst-case values){'<br>' + reason if reason else ''}"
    vals = "<br>".join(f"{o.metric}={v:.4g}" for o, v in zip(objectives, t.values))
    params = "<br>".join(f"{k}={v}" for k, v in t.params.items())
    return f"{head}<br>{vals}<br>{params}"


def pareto_front(trials: Sequence[TrialRecord], objectives: Sequence[Objective],
                 pareto: Sequence[int], chosen: int | None) -> go.Figure:
    """Each pair of objectives, every trial coloured by outcome; Pareto set ringed, pick starred."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    pairs = list(itertools.combinations(range(len(objectives)), 2)) or [(0, 0)]
    cols = min(3, len(pairs))
    rows = -(-len(pairs) // cols)
    fig = make_subplots(rows=rows, cols=cols, horizontal_spacing=0.08, vertical_spacing=0.15)
    axes = {i: _axis_values(done, i, o) for i, o in enumerate(objectives)}
    for n, (a, b) in enumerate(pairs):
        row, col = n // cols + 1, n % cols + 1
        xs = axes[a] if a != b else [t.number for t in done]
        ys = axes[b]
        for name in dict.fromkeys(t.outcome for t in done):
            idx = [k for k, t in enumerate(done) if t.outcome == name]
            fig.add_trace(
                go.Scatter(
                    x=[xs[k] for k in idx],
                    y=[ys[k] for k in idx],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=n == 0,
                    marker=dict(
                        color=_color(name),
                        size=9,
                        symbol="circle" if name in ("ok", "slo") else "x",
                    ),
                    text=[_hover(done[k], objectives) for k in idx],
                    hoverinfo="text",
                ),
                row=row,
                col=col,
            )
        for name, nums, marker in (
            (
                "Pareto set",
                set(pareto),
                dict(size=16, color="rgba(0,0,0,0)", line=dict(color="#1f77b4", width=2)),
            ),
            ("chosen", {chosen}, dict(size=20, symbol="star", color="#1f77b4")),
        ):
            idx = [k for k, t in enumerate(done) if t.number in nums]
            fig.add_trace(go.Scatter(x=[xs[k] for k in idx], y=[ys[k] for k in idx], mode="markers",
                                     name=name, legendgroup=name, showlegend=n == 0, marker=marker,
                                     hoverinfo="skip"), row=row, col=col)
        fig.update_xaxes(title_text=objectives[a].metric if a != b else "trial", row=row, col=col)
        fig.update_yaxes(title_text=objectives[b].metric, row=row, col=col)
    fig.update_layout(title="Pareto front (colour = outcome; failures drawn at the worst edge, x)",
                      height=80 + 370 * rows)
    return fig


def _measured_study(study: optuna.Study, objectives: Sequence[Objective]
                    ) -> tuple[optuna.Study, list[FrozenTrial]]:
    """An in-memory study of the trials that ran ok (failures only hold worst-case sentinels)."""
    ok = [t for t in study.get_trials(deepcopy=False) if is_measured(t)]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created" line per report
    try:
        copy = optuna.create_study(directions=study.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        copy.set_metric_names([o.metric for o in objectives])
    copy.add_trials(ok)
    return copy, ok


def optimization_history(study: optuna.Study, objectives: Sequence[Objective]) -> go.Figure:
    """optuna's history plot of the first objective over the ok trials (SLO misses shown apart)."""
    copy, ok = _measured_study(study, objectives)
    if not ok:
        return _note("Optimisation history", "no trial ran ok")
    fig = optuna.visualization.plot_optimization_history(
        copy, target=lambda t: t.values[0], target_name=objectives[0].metric)
    # the copy renumbers trials from 0; put the study's own numbers back on the x axis
    for trace in fig.data:
        if trace.x is not None:
            trace.x = [ok[int(x)].number for x in trace.x]
    fig.update_layout(title=f"Optimisation history: {objectives[0]} (ok trials)", height=400)
    return fig


def param_importances(knobs: KnobReport | None) -> go.Figure:
    """The knob check's fANOVA shares as bars, one group per objective: the same numbers
    `tune` and `inspect` print, so the report and the terminal cannot disagree."""
    if knobs is None or not knobs.importance:
        return _note("Parameter importances", f"needs {MIN_TRIALS}+ ok trials with varying knobs")
    names = sorted(knobs.importance, key=lambda k: max(knobs.importance[k].values(), default=0))
    labels = list(dict.fromkeys(lab for per in knobs.importance.values() for lab in per))
    fig = go.Figure(
        [
            go.Bar(
                name=lab,
                orientation="h",
                y=names,
                x=[knobs.importance[k].get(lab, 0.0) for k in names],
            )
            for lab in labels
        ]
    )
    fig.update_layout(title=f"Parameter importances (fANOVA share of each objective's variance, "
                            f"{knobs.trials_used} ok trials)", barmode="group",
                      xaxis_title="share of variance", xaxis_tickformat=".0%",
                      height=160 + 40 * len(names) * max(len(labels), 1))
    return fig


def failure_map(trials: Sequence[TrialRecord]) -> go.Figure:
    """For each knob: the values tried, on the outcome they had (which values OOM or crash)."""
    params = sorted({p for t in trials for p in t.params})
    if not params:
        return _note("Failure map", "no trial has parameters")
    cols = min(3, len(params))
    rows = -(-len(params) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=params, vertical_spacing=0.12)
    rng = random.Random(0)
    order = list(dict.fromkeys(sorted((t.outcome for t in trials), key=lambda n: (n != "ok", n))))
    for n, p in enumerate(params):
        row, col = n // cols + 1, n % cols + 1
        for name in order:
            sub = [t for t in trials if t.outcome == name and p in t.params]
            if not sub:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[_plain(t.params[p]) for t in sub],
                    y=[order.index(name) + rng.uniform(-0.2, 0.2) for t in sub],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=n == 0,
                    marker=dict(color=_color(name), size=8),
                    text=[f"trial {t.number}: {p}={t.params[p]} -> {name}" for t in sub],
                    hoverinfo="text",
                ),
                row=row,
                col=col,
            )
        fig.update_yaxes(tickvals=list(range(len(order))), ticktext=order, row=row, col=col)
    fig.update_layout(title="Failure map: outcome of each value tried, per knob", height=300 * rows)
    return fig


def _plain(v: Any) -> Any:
    return str(v) if isinstance(v, bool) else v


def cells_table(chosen: TrialRecord | None, default: TrialRecord | None) -> go.Figure:
    """Per-cell metrics of the chosen config beside the server's default config."""
    if chosen is None:
        return _note("Chosen config per cell", "no config chosen (nothing feasible)")
    by_cell: dict[str, dict[str, dict]] = {}
    for who, t in (("chosen", chosen), ("default", default)):
        for c in t.cells if t else []:
            by_cell.setdefault(cell_id(c.get("cell", {})), {})[who] = c.get("metrics") or {}
    header = ["cell"]
    for m in CELL_METRICS:
        header += [
            f"{m}<br>chosen #{chosen.number}",
            f"default{f' #{default.number}' if default else ''}",
        ]
    rows: list[list[str]] = []
    for cell, got in by_cell.items():
        row = [cell]
        for m in CELL_METRICS:
            row += [_num(got.get("chosen", {}).get(m)),
                    _num(got.get("default", {}).get(m)) if default else "no default trial"]
        rows.append(row)
    fig = go.Figure(
        go.Table(
            header=dict(values=header, align="left"),
            cells=dict(
                values=list(map(list, zip(*rows))) if rows else [[]] * len(header), align="left"
            ),
        )
    )
    fig.update_layout(title=f"Chosen trial {chosen.number} per cell vs the default config"
                            + ("" if default else " (the study ran no default config)"),
                      height=260 + 32 * max(len(rows), 1), margin=dict(t=60, b=10))
    return fig


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else "-"


def memory_headroom(trials: Sequence[TrialRecord]) -> go.Figure | None:
    """Predicted headroom (1 - predicted_peak/capacity) against what happened; None if not
    recorded."""
    pts = []
    for t in trials:
        pred, cap, seen = t.predicted_peak_bytes, t.capacity_bytes, t.peak_bytes
        if pred is not None and cap is not None and cap > 0:
            pts.append((t, 1 - pred / cap, 1 - seen / cap if seen is not None else None))
    if not pts:
        return None
    with_seen = any(s is not None for _, _, s in pts)
    order = sorted({t.outcome for t, _, _ in pts}, key=lambda n: (n != "ok", n))
    fig = go.Figure()
    for name in order:
        sub = [p for p in pts if p[0].outcome == name]
        ys = [s if with_seen else order.index(name) for _, _, s in sub]
        fig.add_trace(go.Scatter(x=[p for _, p, _ in sub], y=ys, mode="markers", name=name,
                                 marker=dict(color=_color(name), size=9),
                                 text=[f"trial {t.number}: predicted {p:.1%}" for t, p, _ in sub],
                                 hoverinfo="text"))
    fig.add_vline(x=0, line_dash="dash", line_color="grey")
    fig.update_layout(title="Memory headroom: predicted vs seen", height=400,
                      xaxis_title="predicted headroom (1 - predicted_peak_bytes / capacity_bytes)",
                      xaxis_tickformat=".0%")
    if with_seen:
        fig.update_yaxes(
            title_text="seen headroom (1 - peak_bytes / capacity_bytes)", tickformat=".0%"
        )
    else:
        fig.update_yaxes(
            title_text="outcome (peak_bytes not recorded)",
            tickvals=list(range(len(order))),
            ticktext=order,
        )
    return fig


def _note(title: str, text: str) -> go.Figure:
    """A figure that only says why there is nothing to plot (keeps the report's layout stable)."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, height=200, xaxis_visible=False, yaxis_visible=False)
    return fig

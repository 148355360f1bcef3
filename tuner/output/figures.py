"""The plotly figures of report.html (and of optuna-dashboard), one function per figure; the
per-trial scatters are in `scatter_figures`.

Failed trials carry worst-case objective values for the sampler, which are no measurement:
figures that plot objectives use the measured trials only.  Every axis names its unit.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial

from tuner.output.knob_check import MIN_TRIALS, KnobReport
from tuner.output.numbers import axis_title, default_blank_reason, fmt
from tuner.output.scatter_figures import color, failure_map, pareto_front
from tuner.search.objectives import Objective
from tuner.search.slo import cell_id
from tuner.study.record import TrialRecord, is_measured

__all__ = ["cells_table", "failure_map", "memory_headroom", "optimization_history",
           "param_importances", "pareto_front"]

CELL_METRICS = ("output_throughput", "p99_ttft_ms", "p99_tpot_ms", "mean_ttft_ms", "mean_tpot_ms")


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
    fig.update_layout(title=f"Optimisation history: {objectives[0]} (ok trials)", height=400,
                      xaxis_title="trial", yaxis_title=axis_title(objectives[0].metric))
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
        header += [f"{axis_title(m)}<br>chosen #{chosen.number}",
                   f"default{f' #{default.number}' if default else ''}"]
    rows: list[list[str]] = []
    for cell, got in by_cell.items():
        row = [cell]
        for m in CELL_METRICS:
            row += [_num(got.get("chosen", {}).get(m)),
                    _num(got.get("default", {}).get(m)) if default else "no default trial"]
        rows.append(row)
    fig = go.Figure(go.Table(
        header=dict(values=header, align="left"),
        cells=dict(values=list(map(list, zip(*rows))) if rows else [[]] * len(header),
                   align="left")))
    blank = default_blank_reason(default)
    fig.update_layout(title=f"Chosen trial {chosen.number} per cell vs the default config"
                            + (f"<br><sub>default '-': {blank}</sub>" if blank else ""),
                      height=260 + 32 * max(len(rows), 1), margin=dict(t=80, b=10))
    return fig


def _num(v: Any) -> str:
    return fmt(v) if isinstance(v, (int, float)) else "-"


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
                                 marker=dict(color=color(name), size=9),
                                 text=[f"trial {t.number}: predicted {p:.1%}" for t, p, _ in
                                       sub],
                                 hoverinfo="text"))
    fig.add_vline(x=0, line_dash="dash", line_color="grey")
    fig.update_layout(title="Memory headroom: predicted vs seen", height=400,
                      xaxis_title="predicted headroom (% of the card's memory: "
                                  "1 - predicted peak / capacity)",
                      xaxis_tickformat=".0%")
    if with_seen:
        fig.update_yaxes(
            title_text="seen headroom (% of the card's memory: 1 - peak / capacity)",
            tickformat=".0%"
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

"""The two per-trial scatter figures of report.html: the Pareto front and the failure map.

Why apart from the other figures: both must show every trial without inventing numbers.  A
failed or skipped trial has no measured objective values (Optuna holds worst-case stand-ins for
the sampler), so the Pareto front does not draw it at all: its legend and a note count such
trials per outcome.  The failure map draws one marker per (knob value, outcome) sized and
labelled by the number of trials behind it, so markers never hide each other's counts.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from optuna.trial import TrialState
from plotly.subplots import make_subplots

from tuner.output.numbers import axis_title, fmt
from tuner.search.objectives import Objective
from tuner.study.record import Stage, TrialRecord

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


def color(name: str) -> str:
    return OUTCOME_COLORS.get(name, "#17becf")


def _hover(t: TrialRecord, objectives: Sequence[Objective]) -> str:
    vals = "<br>".join(f"{o.metric} {fmt(v)}" for o, v in zip(objectives, t.values or ()))
    params = "<br>".join(f"{k}={v}" for k, v in t.params.items())
    est = " (screened out: estimated values)" if t.stage == Stage.SCREEN else ""
    return f"trial {t.number}: {t.outcome}{est}<br>{vals}<br>{params}"


def _series(t: TrialRecord) -> str:
    """The legend group a measured trial belongs to."""
    return f"{t.outcome} (screening estimate)" if t.stage == Stage.SCREEN else t.outcome


def unmeasured_counts(trials: Sequence[TrialRecord]) -> Counter[str]:
    """Finished trials without measured values, by outcome."""
    return Counter(t.outcome for t in trials if t.state == TrialState.COMPLETE and not t.measured)


def pareto_front(trials: Sequence[TrialRecord], objectives: Sequence[Objective],
                 pareto: Sequence[int], chosen: int | None) -> go.Figure:
    """Each pair of objectives over the measured trials, coloured by outcome; the Pareto set
    ringed, the pick starred; trials without measurements counted in the legend, not drawn."""
    done = [t for t in trials if t.measured]
    pairs = list(itertools.combinations(range(len(objectives)), 2)) or [(0, 0)]
    cols = min(3, len(pairs))
    rows = -(-len(pairs) // cols)
    fig = make_subplots(rows=rows, cols=cols, horizontal_spacing=0.08, vertical_spacing=0.15)
    for n, (a, b) in enumerate(pairs):
        row, col = n // cols + 1, n % cols + 1
        _pair(fig, done, objectives, (a, b), (row, col), n == 0, set(pareto), chosen)
        fig.update_xaxes(title_text=axis_title(objectives[a].metric) if a != b else "trial",
                         row=row, col=col)
        fig.update_yaxes(title_text=axis_title(objectives[b].metric), row=row, col=col)
    missing = unmeasured_counts(trials)
    for name, count in missing.most_common():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{name}: {count} "
                                 f"trial{'s' if count > 1 else ''}, not measured (not drawn)",
                                 marker=dict(color=color(name), size=9, symbol="x")))
    note = ("; not drawn (no measured values): "
            + ", ".join(f"{c} {o}" for o, c in missing.most_common())) if missing else ""
    fig.update_layout(title=f"Pareto front of the measured trials (colour = outcome){note}",
                      height=80 + 370 * rows)
    return fig


def _pair(fig: go.Figure, done: Sequence[TrialRecord], objectives: Sequence[Objective],
          pair: tuple[int, int], cell: tuple[int, int], legend: bool, pareto: set[int],
          chosen: int | None) -> None:
    a, b = pair

    def xy(ts: Sequence[TrialRecord]) -> dict[str, list[Any]]:
        xs = [t.values[a] if a != b else t.number for t in ts if t.values]
        return {"x": xs, "y": [t.values[b] for t in ts if t.values]}

    groups: dict[str, list[TrialRecord]] = defaultdict(list)
    for t in done:
        groups[_series(t)].append(t)
    for name, ts in groups.items():
        symbol = "circle-open" if ts[0].stage == Stage.SCREEN else "circle"
        fig.add_trace(go.Scatter(**xy(ts), mode="markers", name=name, legendgroup=name,
                                 showlegend=legend, hoverinfo="text",
                                 marker=dict(color=color(ts[0].outcome), size=9, symbol=symbol),
                                 text=[_hover(t, objectives) for t in ts]), row=cell[0],
                      col=cell[1])
    ring = dict(size=16, color="rgba(0,0,0,0)", line=dict(color="#1f77b4", width=2))
    star = dict(size=20, symbol="star", color="#1f77b4")
    for name, nums, marker in (("Pareto set", pareto, ring), ("chosen", {chosen}, star)):
        fig.add_trace(go.Scatter(**xy([t for t in done if t.number in nums]), mode="markers",
                                 name=name, legendgroup=name, showlegend=legend, marker=marker,
                                 hoverinfo="skip"), row=cell[0], col=cell[1])


def _plain(v: Any) -> Any:
    return str(v) if isinstance(v, bool) else v


def failure_map(trials: Sequence[TrialRecord]) -> go.Figure:
    """For each knob: the values tried, on the outcome they had; one marker per (value,
    outcome), its size and label the number of trials."""
    params = sorted({p for t in trials for p in t.params})
    if not params:
        fig = go.Figure()
        fig.update_layout(title="Failure map: no trial has parameters", height=200)
        return fig
    cols = min(3, len(params))
    rows = -(-len(params) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=params, vertical_spacing=0.12)
    order = list(dict.fromkeys(sorted((t.outcome for t in trials), key=lambda n: (n != "ok", n))))
    for n, p in enumerate(params):
        row, col = n // cols + 1, n % cols + 1
        for name in order:
            seen: dict[Any, list[int]] = defaultdict(list)
            for t in trials:
                if t.outcome == name and p in t.params:
                    seen[_plain(t.params[p])].append(t.number)
            if not seen:
                continue
            counts = [len(v) for v in seen.values()]
            fig.add_trace(go.Scatter(
                x=list(seen), y=[name] * len(seen), mode="markers+text", name=name,
                legendgroup=name, showlegend=n == 0,
                marker=dict(color=color(name), size=[8 + 4 * math.sqrt(c - 1) for c in counts],
                            opacity=0.8),
                text=[str(c) if c > 1 else "" for c in counts], textposition="top center",
                hovertext=[f"{p}={v}: {name} in {len(nums)} trial{'s' if len(nums) > 1 else ''}"
                           f" ({', '.join(map(str, nums))})" for v, nums in seen.items()],
                hoverinfo="text"), row=row, col=col)
        fig.update_yaxes(categoryorder="array", categoryarray=order, row=row, col=col)
    fig.update_layout(title="Failure map: outcome of each value tried, per knob (label: number "
                            "of trials when more than one)", height=300 * rows)
    return fig

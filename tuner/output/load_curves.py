"""The capacity figure of report.html: latency against offered load, one curve per config.

Each trial that ran a capacity search (`TrialRecord.capacity_search`, tuner.bench.capacity) measured
p99 TTFT and p99 TPOT at a few request rates; the Pareto configs (and the default, if the study
ran it) are drawn as curves over those steps, failed steps hollow, and each config's capacity as
a dashed vertical line.  A step cut short drew its percentile from the requests it finished,
which understates the latency of an overloaded rate: its marker is hollow and says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.output.numbers import axis_title, fmt
from tuner.study.record import TrialRecord

PANELS = (("p99_ttft_ms", "p99 TTFT (ms)"), ("p99_tpot_ms", "p99 TPOT (ms)"))
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
MAX_CURVES = len(PALETTE)


def load_curves(trials: Sequence[TrialRecord], pareto: Sequence[int],
                default: TrialRecord | None) -> go.Figure | None:
    """None when no trial to draw has a capacity record."""
    chosen = [t for t in trials if t.number in set(pareto)]
    if default is not None and default.number not in set(pareto):
        chosen.append(default)
    chosen = [t for t in chosen if t.capacity_search and t.capacity_search.get("steps")]
    if not chosen:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=[title for _, title in PANELS])
    for i, t in enumerate(chosen[:MAX_CURVES]):
        color = PALETTE[i % len(PALETTE)]
        cap = t.capacity_search
        assert cap is not None
        steps = sorted(cap["steps"], key=lambda s: s["rate"])
        name = f"trial {t.number}{' (default)' if t is default else ''}: " \
               f"{fmt(cap['capacity_rps'])} req/s"
        for col, (metric, _) in enumerate(PANELS, start=1):
            fig.add_trace(go.Scatter(
                x=[s["rate"] for s in steps], y=[s.get(metric) for s in steps],
                mode="lines+markers", name=name, legendgroup=str(t.number), showlegend=col == 1,
                line={"color": color},
                marker={"color": [color if s["passed"] else "white" for s in steps],
                        "line": {"color": color, "width": 2}, "size": 9},
                hovertext=[_hover(s) for s in steps], hoverinfo="text"), row=1, col=col)
            fig.add_vline(x=cap["capacity_rps"], line={"color": color, "dash": "dash"},
                          row=1, col=col)
    fig.update_xaxes(title_text="offered load (req/s)", type="log")
    for col, (metric, _) in enumerate(PANELS, start=1):
        fig.update_yaxes(title_text=axis_title(metric), type="log", row=1, col=col)
    fig.update_layout(title="Latency vs load (Pareto configs; dashed: capacity under the SLOs; "
                            "hollow: step failed)", height=460)
    return fig


def _hover(step: dict) -> str:
    state = "passed" if step["passed"] else ("cut short: SLO lost" if step["cut_short"] else
                                             "failed")
    return (f"{fmt(step['rate'])} req/s: {state}<br>p99 TTFT {fmt(step.get('p99_ttft_ms', '-'))} ms"
            f"<br>p99 TPOT {fmt(step.get('p99_tpot_ms', '-'))} ms<br>{step['sent']} requests, "
            f"{fmt(step['cost_s'])} s")

"""report.html: one self-contained, offline page of the study's figures (plotly.js inlined).

The page sets `document.body.dataset.figures` to the number of figures once every Plotly.newPlot
has resolved, and records any JavaScript error in `document.body.dataset.jsErrors` and a visible
box, so a headless browser can check the page with --dump-dom alone.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import optuna
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from tuner.output import envfile, figures
from tuner.output.knob_check import knob_report
from tuner.output.load_curves import load_curves
from tuner.output.numbers import default_trial, with_unit
from tuner.output.select import Choice, study_objectives
from tuner.study.record import records
from tuner.study.study_record import StudyInfo

_ONERROR = """<script>
(function(){function rec(msg){var b=document.body;var e=JSON.parse(b.dataset.jsErrors||"[]");
e.push(String(msg));b.dataset.jsErrors=JSON.stringify(e);
var box=document.getElementById("js-errors");
box.style.display="block";box.textContent+=String(msg)+"\\n";}
window.onerror=function(m,s,l,c){rec(m+" at "+s+":"+l+":"+c);};
window.addEventListener("unhandledrejection",function(ev){rec("unhandled rejection: "+ev.reason);});
window.tunerRecordError=rec;})();
</script>"""
_RENDER = """<script>
(function(){var ids=%s;var done=ids.map(function(id){
var spec=JSON.parse(document.getElementById(id+"-data").textContent);
return Plotly.newPlot(id,spec.data,spec.layout,{responsive:true,displaylogo:false});});
Promise.all(done).then(function(){document.body.dataset.figures=String(ids.length);},
function(e){window.tunerRecordError("render failed: "+e);});})();
</script>"""
_STYLE = """<style>body{font-family:sans-serif;margin:1.5em;color:#222}table.kv td{padding:2px 10px}
section{margin:1.5em 0}#js-errors{display:none;background:#fdd;border:1px solid #d33;padding:.5em;
white-space:pre-wrap}.fig{min-height:200px}code{background:#f4f4f4;padding:1px 3px}</style>"""


def build_figures(study: optuna.Study, choice: Choice | None) -> dict[str, go.Figure]:
    """Figure id -> figure; `memory` is absent when no trial recorded predicted memory."""
    trials = records(study)
    objectives = study_objectives(study)
    chosen = choice.trial if choice else None
    pareto = [t.number for t in choice.pareto] if choice else []
    figs = {
        "pareto": figures.pareto_front(trials, objectives, pareto,
                                       chosen.number if chosen else None),
        "importances": figures.param_importances(knob_report(study)),
        "history": figures.optimization_history(study, objectives),
        "failures": figures.failure_map(trials),
        "cells": figures.cells_table(chosen, default_trial(trials)),
    }
    memory = figures.memory_headroom(trials)
    if memory is not None:
        figs["memory"] = memory
    curves = load_curves(trials, pareto, default_trial(trials))
    if curves is not None:
        figs["capacity"] = curves
    return figs


def _kv(rows: Mapping[str, object]) -> str:
    cells = "".join(f"<tr><td><b>{html.escape(str(k))}</b></td><td>{html.escape(str(v))}</td></tr>"
                    for k, v in rows.items())
    return f"<table class='kv'>{cells}</table>"


def _summary(study: optuna.Study, choice: Choice | None) -> str:
    meta = StudyInfo.of(study)
    trials = records(study)
    counts = Counter(t.outcome for t in trials)
    info = {
        "study": study.study_name,
        "model": meta.model,
        "gpu": meta.gpu,
        "search space": meta.space,
        "workload": meta.workload,
        "objectives": ", ".join(map(str, study_objectives(study))),
        "trials": f"{len(trials)} (" + ", ".join(f"{n} {o}" for o, n in counts.most_common()) + ")",
    }
    if choice is None:
        return _kv(info) + "<p><b>No feasible trial: nothing chosen.</b></p>"
    t = choice.trial
    info.update(
        {
            "chosen trial": f"{t.number} ({choice.rule})",
            "Pareto set": ", ".join(str(p.number) for p in choice.pareto),
            "chosen values": ", ".join(
                f"{o.metric} {with_unit(o.metric, v)}"
                for o, v in zip(study_objectives(study), t.values or ())
            ),
            "chosen params": ", ".join(f"{k}={v}" for k, v in t.params.items()),
            "launch": envfile.server_args_line(list(t.argv)),
        }
    )
    return _kv(info)


def _fig_json(fig: go.Figure) -> str:
    """Figure JSON safe inside <script>: '<' escaped so no '</script>' can end the block."""
    return pio.to_json(fig, validate=False).replace("<", "\\u003c")


def render_html(study: optuna.Study, choice: Choice | None, figs: Mapping[str, go.Figure]) -> str:
    """The whole page as one string."""
    sections = []
    for fid, fig in figs.items():
        sections.append(
            f"<section><div id='{fid}' class='fig'></div>"
            f"<script type='application/json' id='{fid}-data'>{_fig_json(fig)}</script></section>"
        )
    if "memory" not in figs:
        sections.append("<section id='memory-note'><h3>Memory headroom: predicted vs seen</h3>"
                        "<p>not recorded (no trial has a predicted peak and the card's "
                        "capacity)</p></section>")
    title = html.escape(f"tuner report: {study.study_name}")
    return "\n".join([
        "<!DOCTYPE html><html><head><meta charset='utf-8'>", f"<title>{title}</title>", _STYLE,
        "</head><body>", _ONERROR, "<div id='js-errors'></div>", f"<h1>{title}</h1>",
        _summary(study, choice),
        f"<script>{plotly.offline.get_plotlyjs()}</script>", *sections,
        _RENDER % json.dumps(list(figs)), "</body></html>"])


def write_report(path: Path, study: optuna.Study, choice: Choice | None) -> dict[str, go.Figure]:
    """Write report.html atomically; returns the figures so they can also go to the dashboard."""
    figs = build_figures(study, choice)
    text = render_html(study, choice, figs)
    envfile.write_atomic(path, text, encoding="utf-8")
    return figs


def store_in_dashboard(study: optuna.Study, figs: Mapping[str, go.Figure]) -> bool:
    """Save the figures in the study for optuna-dashboard (fixed ids, so reruns overwrite)."""
    try:
        from optuna_dashboard import save_plotly_graph_object
    except ImportError:
        return False
    for fid, fig in figs.items():
        save_plotly_graph_object(study, fig, graph_object_id=f"tuner-{fid}")
    return True

"""The block that ends `tune` and `inspect`: what was picked, why, the alternatives, and the
command that starts the real server with it, so the next step needs no guessing."""

from __future__ import annotations

from collections.abc import Mapping

import optuna

from tuner.output.export import ExportConfig
from tuner.output.numbers import default_trial, vs_default_line, with_unit
from tuner.output.select import Choice, study_objectives
from tuner.study.record import records

_WHY = {
    "knee": "knee of the feasible Pareto set (the best balance of the objectives; "
            "`tuner export --pick max-throughput` takes the fastest instead)",
    "max-throughput": "highest output throughput among feasible trials",
    "min-ttft": "lowest p99 time to first token among feasible trials",
    "min-tpot": "lowest p99 time per output token among feasible trials",
    "slo": "highest throughput within the SLO",
}


def metric_text(values: Mapping[str, float]) -> str:
    """`output_throughput 214.6 tok/s, p99_ttft_ms 812.0 ms`: units, rounded."""
    return ", ".join(f"{k} {with_unit(k, v)}" for k, v in values.items())


def result_lines(study: optuna.Study, choice: Choice, cfg: ExportConfig) -> list[str]:
    objectives = study_objectives(study)
    t = choice.trial

    def values(rec: object) -> dict[str, float]:
        return {o.metric: v for o, v in zip(objectives, getattr(rec, "values", None) or ())}

    base = choice.rule.replace(",", " ").split()[0]
    extra = choice.rule[len(base):].strip(" ,")
    why = _WHY.get(base, base) + (f"; {extra}" if extra else "")
    lines = [f"result: trial {t.number}: {metric_text(values(t))}", f"  why: {why}",
             f"  {vs_default_line(t, default_trial(records(study)), objectives)}"]
    others = [p for p in choice.pareto if p.number != t.number]
    if others:
        lines.append(f"  Pareto alternatives ({len(others)}; `tuner export --trial N`):")
        lines += [f"    trial {p.number}: {metric_text(values(p))}" for p in others]
    real = cfg.provenance.get("launch_is_real")
    lines.append("  launch the server with it" + ("" if real else " (as tried; the study does "
                                                 "not record the real command)") + ":")
    lines.append(f"    {cfg.provenance['launch']}")
    return lines

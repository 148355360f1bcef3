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

    base = choice.rule.replace(",", " ").replace(";", " ").split()[0]
    extra = choice.rule[len(base):].strip(" ,;")
    why = _WHY.get(base, base) + (f"; {extra}" if extra else "")
    lines = [f"result: trial {t.number}: {metric_text(values(t))}", f"  why: {why}",
             f"  {vs_default_line(t, default_trial(records(study)), objectives)}"]
    others = [p for p in choice.pareto if p.number != t.number]
    if others:
        lines.append(f"  Pareto alternatives ({len(others)}; `tuner export --trial N`):")
        lines += _alternatives(values(t), [(p.number, values(p)) for p in others])
    real = cfg.provenance.get("launch_is_real")
    lines.append("  launch the server with it" + ("" if real else " (as tried; the study does "
                                                 "not record the real command)") + ":")
    lines.append(f"    {cfg.provenance['launch']}")
    return lines


def _alternatives(pick: dict[str, float],
                  others: list[tuple[int, dict[str, float]]]) -> list[str]:
    """One line per distinct result as printed.  Why: a flip of a knob that makes no
    difference measures the same values again (to the printed digit, not always to the last
    bit), and the quick start listed five alternatives of which three were copies of the pick
    or of each other."""
    groups: dict[str, list[int]] = {}
    for number, vals in others:
        groups.setdefault(metric_text(vals), []).append(number)
    mine = metric_text(pick)
    return [f"    {_trials(numbers)}: " + (
        "the pick's values (they differ from it in knobs that made no difference)"
        if text == mine else text) for text, numbers in groups.items()]


def _trials(numbers: list[int]) -> str:
    return (f"trial {numbers[0]}" if len(numbers) == 1
            else "trials " + ", ".join(str(n) for n in numbers))
